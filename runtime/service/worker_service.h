// A worker's side of a job: one handler per message of the protocol, its
// state in named members, the engine stepped in between. It reaches the rest
// of the job only through a WorkerPort (MPI, or in-process for tests), so it
// holds no MPI and runs under a unit test as well as under mpirun.
//
// One service serves every role:
//  - a request with prefill_rank < 0 runs here entirely (aggregated, or a
//    short prompt prefilled on its decode rank);
//  - with prefill_rank >= 0 (decode side), blocks for the part of the prompt
//    not cached here are reserved and handed to that prefill rank
//    (kPrefill); the request continues here once its KV has landed, which
//    the transfer's notification says;
//  - a prefill rank runs kPrefill requests to their first token and posts
//    the KV into the decode rank's blocks, the handoff (first token,
//    counters) riding along as the notification. It never waits for the
//    transfer: its blocks are freed when the port reports it done.
//
// Re-splits (kRoles, at rank 0's epoch boundaries) change no behaviour here
// (rank 0 routes by role), only the rank's role and name, at once: no worker
// waits for another (roles are not communicators: nothing is sent to a role).
// A re-split that changes this worker's width (kRegroup) ends it as kShutdown
// would, without abandon and with the tiers left open: the rank then
// regroups (launcher/run/worker_rank.cpp). kGroupMap tells of the workers
// other cells became: the port routes KV by it from then on, and rank 0 hears
// so (kGroupMapAck) before it sends work that moves KV to them.
//
// Not thread-safe: the rank's main loop drives it (tick() until finished()).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "runtime/service/protocol.h"
#include "runtime/service/worker_core.h"
#include "runtime/service/worker_port.h"

namespace tandem::service {

// Rank 0 went silent: this worker's node is cut off from it (or rank 0
// hangs). Thrown by WorkerService::tick; the launcher ends the rank at once.
struct RouterLost : Error {
  using Error::Error;
};

class WorkerService {
 public:
  using Clock = std::chrono::steady_clock;
  // on_role: called with the new role's name after a re-split (for the log's identity); may be empty.
  WorkerService(WorkerCore& core, WorkerPort& port, std::function<void(Role)> on_role = {});

  // One pass: messages, reservations, an engine step, transfers, re-splits,
  // reports. True when anything happened (else the caller backs off).
  // Throws RouterLost when a pass with nothing to do finds rank 0 silent for
  // longer than the router timeout (rank 0 pings while it has nothing else
  // to send: MpiLink).
  bool tick();
  // job.worker_timeout_seconds under MPI (0: never; in-process: no pings).
  void set_router_timeout(double seconds) { router_timeout_s_ = seconds; }
  // Rank 0 said stop (kShutdown) and, unless it said abandon, every request
  // here has finished and every transfer ended.
  bool finished() const;
  // A KV transfer of ours, or to us, is under way: its transport may move
  // data only while this rank calls it (libfabric's tcp, osc/pt2pt).
  bool moving_kv() const { return !awaiting_.empty() || !sending_.empty(); }
  // The end: the tiers closed (not for a regroup), the final counters to rank 0, every message out.
  void finish();
  // Set once rank 0 said regroup (kRegroup): its WireRoles, as it came. Empty otherwise.
  const std::vector<uint8_t>& regroup_note() const { return regroup_; }

 private:
  // A decode-side request whose prompt KV comes from a prefill rank.
  struct AwaitingKv {
    WireRequest request;
    std::vector<int32_t> blocks;  // cached prefix blocks, then the reserved ones
    Clock::time_point arrival;
    int64_t moved = 0;            // how many of blocks the prefill rank sends
    bool cancelled = false;       // rank 0 dropped it: its KV still lands in these blocks, then they go
  };
  // A prefill-side request: where its KV goes.
  struct Destination {
    std::vector<int32_t> blocks;
    int decode_rank = 0;
    int64_t skip = 0;  // leading prompt blocks the decode rank already has
  };
  // A KV transfer of ours in flight.
  struct Sending {
    int64_t id = 0;
    std::vector<int32_t> blocks;  // ours, held until the transfer no longer reads them
    std::size_t bytes = 0;
    int dest = 0;
  };
  // Wall time with at least one transfer of ours in flight: the union of
  // their times (post to seen done), not their sum, so overlapping
  // transfers give the rate the link carried.
  struct InFlight {
    int n = 0;
    Clock::time_point since;
    void start(Clock::time_point now) {
      if (n++ == 0) since = now;
    }
    double stop(Clock::time_point now) {  // the period's seconds when it ends, else 0
      return --n == 0 ? std::chrono::duration<double>(now - since).count() : 0.0;
    }
  };

  // Handlers, one per message type.
  void on_request(WireRequest r);
  void on_prefill(WirePrefill p);
  void on_cancel(int source, uint64_t id);
  void on_roles(WireRoles r);
  void on_shutdown(bool abandon);
  void on_group_map(const std::vector<uint8_t>& bytes);
  void on_kv_arrived(const WorkerPort::KvArrival& a);

  bool receive_messages();
  bool reserve_for_prefill();
  bool step_engine();
  void send_handoff(WorkerCore::Handoff& h);
  bool drive_transfers();
  void report_now_and_then();
  // Runs a port call and counts the time spent in it (the KV wait reported).
  template <class F>
  auto timed(F&& call);

  WorkerCore& core_;
  WorkerPort& port_;
  std::function<void(Role)> on_role_;
  std::deque<std::pair<WireRequest, Clock::time_point>> to_reserve_;  // decode side, waiting for free blocks
  std::unordered_map<uint64_t, AwaitingKv> awaiting_;
  std::unordered_map<uint64_t, Destination> destinations_;
  std::vector<Sending> sending_;
  InFlight sending_all_;                 // any transfer of ours
  std::map<int, InFlight> sending_to_;   // by destination rank
  bool stopping_ = false, abandon_ = false;
  std::vector<uint8_t> regroup_;
  double router_timeout_s_ = 0;
  Clock::time_point heard_router_ = Clock::now();  // the last message from rank 0
  double kv_wait_s_ = 0;
  Clock::time_point last_cache_report_ = Clock::now(), last_stats_ = Clock::now();
  std::vector<WorkerPort::KvArrival> arrivals_;  // scratch
};

}  // namespace tandem::service
