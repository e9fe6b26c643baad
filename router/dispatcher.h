// Rank 0's side of placement, shared by the batch job (`tandem run`) and
// the HTTP shim (`tandem serve`): what every worker has cached (from their
// cache reports) and holds (the requests placed there, until each result
// comes back), turned into candidates for place() (placement.h), the pure
// function the planner's simulator calls too. The workers are reached
// through a WorkerLink: MPI messages, or an engine in this process.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <vector>

#include "router/kv_aware_policy.h"
#include "router/placement.h"
#include "runtime/service/protocol.h"

namespace tandem::router {

// What a poll of the workers brought.
struct LinkEvents {
  std::vector<service::WireResult> results;
  std::vector<service::WireCacheEvents> cache_events;
  std::vector<service::WireDeltas::Delta> deltas;   // streaming requests' new tokens
  std::vector<service::RankReport> stats;   // workers' periodic counters (the first: loaded)
  void clear() {
    results.clear();
    cache_events.clear();
    deltas.clear();
    stats.clear();
  }
};

class WorkerLink {
 public:
  virtual ~WorkerLink() = default;
  // Worker ranks requests can go to (they decode, and prefill what stays local).
  virtual std::vector<int> workers() const = 0;
  // Ranks that only prefill (disaggregated); empty in aggregated mode.
  virtual std::vector<int> prefill_workers() const { return {}; }
  virtual void submit(int worker, const service::WireRequest& request) = 0;
  // Drop a request on its decode worker; it comes back as an "abort" result.
  virtual void cancel(int worker, uint64_t id) = 0;
  // Appends what arrived; may block briefly (back-off) when nothing is ready.
  virtual void poll(LinkEvents& events) = 0;
  // After the last result: stop the workers and collect their counters.
  // abandon: the workers drop what they still hold (a signal's drain ran out).
  virtual std::vector<service::RankReport> shutdown(bool abandon) = 0;
  // A re-split: from now on `prefill` ranks only prefill and the other
  // workers decode (none prefill: aggregated). False where roles cannot change.
  virtual bool set_roles(int64_t, const std::vector<int>&) { return false; }
  // Moves re-splits that change workers' widths along (router/regroups.h);
  // busy(rank): a request placed there has not come back. True when
  // workers() or prefill_workers() changed.
  virtual bool regroup(const std::function<bool(int)>& busy) {
    (void)busy;
    return false;
  }
  // A cell is on its way (regroup() has more to do).
  virtual bool regrouping() const { return false; }
  // Ranks whose KV pools were emptied (regrouped) since the last call.
  virtual std::vector<int> take_emptied() { return {}; }
};

using DispatchOptions = PlacementOptions;

class Dispatcher {
 public:
  Dispatcher(WorkerLink& link, DispatchOptions options);

  struct Placement {
    int worker = 0;
    int prefill = -1;  // prefill rank, or -1 when prefilled on `worker`
  };
  // Places and sends a request (r.prefill_rank is set here).
  Placement submit(service::WireRequest r);
  // Polls the link; results release the load their requests added.
  void poll(LinkEvents& events);
  // Asks the request's worker to drop it (its result still comes back).
  void cancel(uint64_t id);
  // Cancels every request in flight (a drain that ran out of time).
  void cancel_all();
  // The link's roles changed (a re-split): place on its current workers from now on.
  void refresh();
  std::size_t in_flight() const { return placed_.size(); }
  // A request placed on `rank` (to decode or to prefill) has not come back.
  bool busy(int rank) const;
  // `rank`'s pool was emptied (it regrouped): what it held there is forgotten.
  void forget(int rank) { kv_index_.forget_device(rank); }
  WorkerLink& link() { return link_; }

 private:
  struct Placed {
    Placement where;
    int64_t blocks = 0;
    int64_t prompt_tokens = 0;
    bool embedding = false;         // a prefill alone (submit_embedding)
    bool on_prefill_worker = false;  // an embedding counted in prefill_queue_ (else in load_)
  };
  Placement submit_embedding(service::WireRequest r);
  WorkerLink& link_;
  DispatchOptions o_;
  std::vector<int> workers_, prefillers_;
  std::map<int, int64_t> load_;           // requests in flight per worker
  std::map<int, int64_t> active_blocks_;  // prompt blocks of those requests
  std::map<int, int64_t> prefill_queue_;  // prompt tokens sent to each prefill rank, not yet finished
  KvIndex kv_index_;
  uint64_t turn_ = 0;
  std::unordered_map<uint64_t, Placed> placed_;
};

}  // namespace tandem::router
