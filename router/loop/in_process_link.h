// How rank 0's loop reaches a worker in the same process (-np 1): the
// engine is stepped when the loop polls. No MPI.
#pragma once

#include <chrono>
#include <iterator>
#include <vector>

#include "common/backoff.h"
#include "router/dispatcher.h"
#include "runtime/service/worker_core.h"

namespace tandem::router {

// -np 1: the router steps an engine in this process.
class InProcessLink : public WorkerLink {
 public:
  explicit InProcessLink(service::WorkerCore& core) : core_(core) {}
  std::vector<int> workers() const override { return {0}; }
  void submit(int, const service::WireRequest& r) override { core_.submit(r); }
  void cancel(int, uint64_t id) override { core_.cancel(id); }
  void poll(LinkEvents& events) override {
    if (!core_.has_work()) {
      idle_.idle();  // serving with nothing to do: wait, do not spin
    } else {
      auto r = core_.step();  // in process, nothing is handed off: -np 1 is aggregated
      if (r.progress) idle_.reset();
      else idle_.idle();  // only requests waiting on the disk store
      events.results.insert(events.results.end(), std::make_move_iterator(r.results.begin()),
                            std::make_move_iterator(r.results.end()));
      events.deltas.insert(events.deltas.end(), std::make_move_iterator(r.deltas.deltas.begin()),
                           std::make_move_iterator(r.deltas.deltas.end()));
    }
    if (!reported_ || std::chrono::steady_clock::now() - last_stats_ > std::chrono::milliseconds(500)) {
      events.stats.push_back(core_.report());
      reported_ = true;
      last_stats_ = std::chrono::steady_clock::now();
    }
  }
  std::vector<service::RankReport> shutdown(bool) override {
    core_.close_tiers();
    return {core_.report()};
  }

 private:
  service::WorkerCore& core_;
  Backoff idle_;
  bool reported_ = false;
  std::chrono::steady_clock::time_point last_stats_;
};

}  // namespace tandem::router
