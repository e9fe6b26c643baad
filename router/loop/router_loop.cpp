#include "router/loop/router_loop.h"

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "router/hosts.h"

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
  // Cells that change width on their way (router/regroups.h): place on the workers there are now.
  if (link_.regroup([this](int rank) { return dispatch_.busy(rank); })) dispatch_.refresh();
  for (int rank : link_.take_emptied()) dispatch_.forget(rank);
  bool newly_loaded = false;
  const auto now = Clock::now();
  for (const auto& r : events_.stats) {
    heard_[r.rank] = now;
    for (const auto& s : r.step_samples) longest_step_[r.rank] = std::max(longest_step_[r.rank], s.seconds);
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
    // While draining too: what a front end accepted before the signal (the HTTP inbox) is placed. Not while
    // every worker regroups (none to place on), nor before the first epoch's regroups are done (the job's layout:
    // its new workers would find every request placed elsewhere).
    if (may_place()) front.admit(*this);
    cancels.clear();
    front.take_cancels(cancels);
    for (uint64_t id : cancels) dispatch_.cancel(id);
    if (draining_ ? drain_done(front) : front.exhausted() && dispatch_.in_flight() == 0) break;
    poll(front);
    check_alive(front);
    front.tick(*this);
  }
  const std::size_t abandoned = dispatch_.in_flight();
  std::vector<service::RankReport> reports;
  try {
    reports = link_.shutdown(abandoned > 0);
  } catch (const Error&) {  // a worker lost at the end: what is done stays done
    front.commit_now();
    throw;
  }
  front.ended(std::move(reports), abandoned);
}

void RouterLoop::check_alive(Frontend& front) {
  if (o_.worker_timeout_seconds <= 0) return;
  const auto now = Clock::now();
  std::string lost;  // every silent worker (one lost node can stall the ranks sending to it as well)
  double longest = 0;
  // Only the workers placed on now: one that regrouped into a follower no longer reports.
  const std::vector<int> decode = link_.workers(), prefill = link_.prefill_workers();
  for (const auto& [rank, heard] : heard_) {
    if (std::find(decode.begin(), decode.end(), rank) == decode.end() &&
        std::find(prefill.begin(), prefill.end(), rank) == prefill.end())
      continue;
    const double silent = std::chrono::duration<double>(now - heard).count();
    // A worker reports between engine steps: never less than 4 of its longest step so far.
    const auto step = longest_step_.find(rank);
    if (silent <= std::max(o_.worker_timeout_seconds, step == longest_step_.end() ? 0.0 : 4 * step->second)) continue;
    lost += (lost.empty() ? "" : ", ") + rank_on_host(rank, o_.hosts);
    longest = std::max(longest, silent);
  }
  if (lost.empty()) return;
  front.commit_now();
  throw Error(fmt::format("worker rank(s) {} not heard from for {:.0f} s (job.worker_timeout_seconds): a node is down or "
                          "unreachable, or a worker hangs; the output is committed: rerun with --resume (on the nodes "
                          "left) to finish the input",
                          lost, longest));
}

}  // namespace tandem::router
