// Rank 0's loop, one for `tandem run` and `tandem serve`: they differ only
// in their front end, the batch file (batch_frontend.h) or the HTTP inbox
// (http_inbox.h). The loop waits for the workers to report in, lets the
// front end place requests (through the dispatcher, placement.h), polls the
// workers and hands their tokens, results and counters to the front end,
// and drains on a stop signal: no more admissions, the requests in flight
// get drain_seconds, then they are cancelled (abort_grace_seconds for the
// aborts to come back; 0: abandoned at once) and the workers are stopped.
// No MPI: the workers are reached through a WorkerLink (MPI messages, or an
// engine in this process). Not thread-safe: rank 0's main thread runs it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "router/dispatcher.h"

namespace tandem::router {

class RouterLoop;

class Frontend {
 public:
  virtual ~Frontend() = default;
  // Workers that have reported in (their first counters say "loaded"), of `want`.
  virtual void workers_loaded(std::size_t loaded, std::size_t want) = 0;
  // Places what it has to place now (loop.place), as many as it sees fit.
  // Called while draining too: a front end takes nothing new then, but may
  // place what it had accepted before the signal (the HTTP inbox does).
  virtual void admit(RouterLoop& loop) = 0;
  // Requests whose client went away, to be cancelled wherever they are.
  virtual void take_cancels(std::vector<uint64_t>& ids) { (void)ids; }
  virtual void on_delta(service::WireDeltas::Delta& d) { (void)d; }
  virtual void on_result(service::WireResult& r) = 0;
  virtual void on_stats(const service::RankReport& r) { (void)r; }
  // Once per pass, after the workers' events: commits, progress, epochs, metrics.
  virtual void tick(RouterLoop& loop) { (void)loop; }
  // Nothing more to place and nothing waiting to be placed (the batch file's
  // end). A server never is: it ends on a signal.
  virtual bool exhausted() const = 0;
  // A stop signal: no more admissions from now on.
  virtual void drain_started(int signal, std::size_t in_flight) = 0;
  // While draining: requests the front end still holds that the loop has not
  // seen (the HTTP threads'); the drain waits for them too.
  virtual bool holds_requests() const { return false; }
  // The end: the workers' final counters; `abandoned` requests were still in flight.
  virtual void ended(std::vector<service::RankReport> reports, std::size_t abandoned) = 0;
  // The job ends early (a worker is lost): keep what is done.
  virtual void commit_now() {}
};

struct LoopOptions {
  double drain_seconds = 60;
  double abort_grace_seconds = 0;  // after drain_seconds: cancel and wait this long for the aborts (0: abandon)
  const std::atomic<int>* stop_signal = nullptr;  // set by a signal handler (USR1, TERM); null: never stops
  // A worker that has reported in and then says nothing for this long (they
  // send counters every half second while they run, between engine steps;
  // never less than 4 of its longest step so far) is lost: its node died, or
  // its link, or it hangs. The front end commits and run() throws
  // tandem::Error naming it. 0: never.
  double worker_timeout_seconds = 0;
  std::vector<std::string> hosts;  // every rank's host, by rank, for that message (may be empty)
};

class RouterLoop {
 public:
  RouterLoop(WorkerLink& link, DispatchOptions options, LoopOptions loop);
  // Runs until the front end is exhausted and nothing is in flight, or a drain ends.
  void run(Frontend& front);

  // For front ends.
  Dispatcher::Placement place(service::WireRequest r) {
    placed_any_ = true;
    return dispatch_.submit(std::move(r));
  }
  void cancel(uint64_t id) { dispatch_.cancel(id); }
  // Whether a request may be placed now: there is a worker to place it on,
  // and the first epoch's regroups (the job's layout) are done.
  bool may_place() const { return !link_.workers().empty() && (placed_any_ || !link_.regrouping()); }
  // The planner's new split (prefill ranks; none: aggregated); false where roles cannot change.
  bool set_roles(int64_t epoch, const std::vector<int>& prefill);
  std::size_t in_flight() const { return dispatch_.in_flight(); }
  std::size_t decode_workers() const { return link_.workers().size(); }
  bool draining() const { return draining_; }
  // Draining, or a stop signal came that the loop has not seen yet: a front
  // end's long work (reading and planning an epoch, placing a window) stops
  // at once, so the loop sees the signal within one line's work.
  bool stop_requested() const { return draining_ || (o_.stop_signal && o_.stop_signal->load() != 0); }

 private:
  void poll(Frontend& front);
  bool drain_done(Frontend& front);
  // Throws when a worker has been silent past worker_timeout_seconds.
  void check_alive(Frontend& front);

  WorkerLink& link_;
  Dispatcher dispatch_;
  LoopOptions o_;
  LinkEvents events_;
  std::vector<int> loaded_;
  std::map<int, std::chrono::steady_clock::time_point> heard_;  // each worker's last counters
  std::map<int, double> longest_step_;                           // each worker's longest engine step, seconds
  std::size_t want_ = 0;
  bool draining_ = false, cancelled_all_ = false;
  bool placed_any_ = false;  // a first epoch's regroups are the job's layout: nothing is placed before they are done
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace tandem::router
