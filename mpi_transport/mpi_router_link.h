// How rank 0's loop reaches the worker ranks under MPI: requests, cancels
// and roles out as messages of the protocol (tag = MsgType), results,
// streamed tokens, cache reports and counters in.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "mpi_transport/mpi_env.h"
#include "router/dispatcher.h"
#include "router/hosts.h"

namespace tandem::mpi {

// Rank 0's own counters: its CPU use over the job (user + system time / wall time).
service::RankReport router_report(std::chrono::steady_clock::time_point started, double cpu_at_start);
// This process's CPU time (user + system, every thread), in seconds.
double process_cpu_seconds();

// Rank 0 under MPI: requests and results are messages.
class MpiLink : public router::WorkerLink {
 public:
  MpiLink(Mailbox& box, std::vector<int> decode, std::vector<int> prefill)
      : box_(box), workers_(std::move(decode)), prefill_(std::move(prefill)) {}
  std::vector<int> workers() const override { return workers_; }
  std::vector<int> prefill_workers() const override { return prefill_; }
  bool set_roles(int64_t epoch, const std::vector<int>& prefill) override {
    std::vector<int> all = workers_;
    all.insert(all.end(), prefill_.begin(), prefill_.end());
    std::sort(all.begin(), all.end());
    prefill_ = prefill;
    workers_.clear();
    for (int w : all)
      if (std::find(prefill.begin(), prefill.end(), w) == prefill.end()) workers_.push_back(w);
    const auto bytes = service::encode(service::WireRoles{epoch, prefill});
    for (int w : all) check(box_.send(w, service::tag_of(service::MsgType::kRoles), bytes));
    return true;
  }
  void submit(int worker, const service::WireRequest& r) override { check(box_.send(worker, service::tag_of(service::MsgType::kRequest), service::encode(r))); }
  void cancel(int worker, uint64_t id) override { check(box_.send(worker, service::tag_of(service::MsgType::kCancel), service::encode_cancel(id))); }
  // Deltas before results: a request's last tokens reach rank 0 before its end.
  void poll(router::LinkEvents& events) override {
    check(box_.progress());
    bool any = false;
    for (int tag : {service::tag_of(service::MsgType::kCacheEvents), service::tag_of(service::MsgType::kStats), service::tag_of(service::MsgType::kDeltas), service::tag_of(service::MsgType::kResult)}) {
      for (;;) {
        std::optional<Message> m;
        check(box_.try_recv(m, MPI_ANY_SOURCE, tag));
        if (!m) break;
        switch (tag) {
          case service::tag_of(service::MsgType::kResult): events.results.push_back(service::decode_result(m->bytes)); break;
          case service::tag_of(service::MsgType::kCacheEvents): events.cache_events.push_back(service::decode_cache_events(m->bytes)); break;
          case service::tag_of(service::MsgType::kStats): events.stats.push_back(service::decode_report(m->bytes)); break;
          default: {
            auto d = service::decode_deltas(m->bytes);
            events.deltas.insert(events.deltas.end(), std::make_move_iterator(d.deltas.begin()),
                                 std::make_move_iterator(d.deltas.end()));
          }
        }
        any = true;
      }
    }
    if (any) backoff_.reset();
    else backoff_.idle();
  }
  // At the end, a worker that sends nothing for this long (they report every
  // half second while they run) is lost: shutdown() throws, naming it. 0: never.
  void set_silence_limit(double seconds, std::vector<std::string> hosts) {
    silence_limit_s_ = seconds;
    hosts_ = std::move(hosts);
  }
  std::vector<service::RankReport> shutdown(bool abandon) override {
    const std::vector<uint8_t> how{static_cast<uint8_t>(abandon ? 1 : 0)};
    for (int w : workers_) check(box_.send(w, service::tag_of(service::MsgType::kShutdown), how));
    for (int w : prefill_) check(box_.send(w, service::tag_of(service::MsgType::kShutdown), how));
    std::vector<service::RankReport> reports{router_report(started_, cpu_started_)};
    // Every tag, in each worker's send order: the counters, deltas and cache
    // reports still on their way must be received too, or a worker whose
    // larger messages wait for a matching receive would never finish sending.
    auto heard = std::chrono::steady_clock::now();
    while (reports.size() < workers_.size() + prefill_.size() + 1) {
      std::optional<Message> m;
      check(box_.try_recv(m, MPI_ANY_SOURCE, MPI_ANY_TAG));
      if (!m) {
        if (silence_limit_s_ > 0 &&
            std::chrono::duration<double>(std::chrono::steady_clock::now() - heard).count() > silence_limit_s_)
          throw Error(silent_workers(reports));
        backoff_.idle();
        continue;
      }
      heard = std::chrono::steady_clock::now();
      if (m->tag == service::tag_of(service::MsgType::kReport)) reports.push_back(service::decode_report(m->bytes));
      else if (m->tag == service::tag_of(service::MsgType::kStats)) late_stats_.push_back(service::decode_report(m->bytes));
    }
    for (const auto& late : late_stats_)  // their measured steps still count
      for (auto& r : reports)
        if (r.rank == late.rank) r.step_samples.insert(r.step_samples.end(), late.step_samples.begin(), late.step_samples.end());
    check(box_.flush());
    return reports;
  }

 private:
  // The workers that have not sent their final report, and where they ran.
  std::string silent_workers(const std::vector<service::RankReport>& reports) const {
    std::string who;
    for (const auto* side : {&workers_, &prefill_})
      for (int w : *side) {
        if (std::any_of(reports.begin(), reports.end(), [w](const auto& r) { return r.rank == w; })) continue;
        who += (who.empty() ? "" : ", ") + router::rank_on_host(w, hosts_);
      }
    return "worker rank(s) " + who + " sent nothing for " + std::to_string(static_cast<int>(silence_limit_s_)) +
           " s at the end of the job (job.worker_timeout_seconds): a node is down or unreachable, or a worker hangs; "
           "the output is committed: rerun with --resume to finish the input";
  }
  static void check(const Status& s) {
    if (!s.ok()) throw Error(s.to_string());
  }
  Mailbox& box_;
  std::vector<int> workers_, prefill_;
  Backoff backoff_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  double cpu_started_ = process_cpu_seconds();
  std::vector<service::RankReport> late_stats_;  // counters that arrived during shutdown
  double silence_limit_s_ = 0;
  std::vector<std::string> hosts_;
};

}  // namespace tandem::mpi
