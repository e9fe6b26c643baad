#include "router/loop/router_loop.h"

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

namespace tandem::router {

using Clock = std::chrono::steady_clock;

RouterLoop::RouterLoop(WorkerLink& link, DispatchOptions options, LoopOptions loop)
    : link_(link), dispatch_(link, options), o_(loop),
      want_(link.workers().size() + link.prefill_workers().size()) {}

bool RouterLoop::set_roles(int64_t epoch, const std::vector<int>& prefill) {
  if (!link_.set_roles(epoch, prefill)) return false;
  dispatch_.refresh();
  return true;
}

// Hands the workers' events to the front end: counters (the first of each
// worker says it has loaded), streamed tokens before results (a request's
// last tokens come before its end).
void RouterLoop::poll(Frontend& front) {
  events_.clear();
  dispatch_.poll(events_);
  bool newly_loaded = false;
  for (const auto& r : events_.stats) {
    if (std::find(loaded_.begin(), loaded_.end(), r.rank) == loaded_.end()) {
      loaded_.push_back(r.rank);
      newly_loaded = true;
    }
    front.on_stats(r);
  }
  if (newly_loaded) front.workers_loaded(loaded_.size(), want_);
  for (auto& d : events_.deltas) front.on_delta(d);
  for (auto& r : events_.results) front.on_result(r);
}

bool RouterLoop::drain_done(Frontend& front) {
  if (dispatch_.in_flight() == 0 && !front.holds_requests()) return true;
  if (Clock::now() < deadline_) return false;
  if (cancelled_all_ || o_.abort_grace_seconds <= 0) return true;  // the rest is abandoned
  spdlog::warn("drain time is up: cancelling {} request(s) still running", dispatch_.in_flight());
  dispatch_.cancel_all();
  cancelled_all_ = true;
  deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.abort_grace_seconds * 1e3));
  return false;
}

void RouterLoop::run(Frontend& front) {
  front.workers_loaded(0, want_);
  std::vector<uint64_t> cancels;
  for (;;) {
    if (!draining_ && o_.stop_signal && o_.stop_signal->load() != 0) {
      draining_ = true;
      deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.drain_seconds * 1e3));
      front.drain_started(o_.stop_signal->load(), dispatch_.in_flight());
    }
    front.admit(*this);  // while draining too: what a front end accepted before the signal (the HTTP inbox) is placed
    cancels.clear();
    front.take_cancels(cancels);
    for (uint64_t id : cancels) dispatch_.cancel(id);
    if (draining_ ? drain_done(front) : front.exhausted() && dispatch_.in_flight() == 0) break;
    poll(front);
    front.tick(*this);
  }
  const std::size_t abandoned = dispatch_.in_flight();
  front.ended(link_.shutdown(abandoned > 0), abandoned);
}

}  // namespace tandem::router
