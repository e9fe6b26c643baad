// The planner's epochs as a batch job keeps them: which input epoch a line
// is in (epoch_requests lines each), which epoch the planner numbered it
// (they differ once a resumed epoch had nothing left to plan), and the time
// from its first request placed to its last one back: the epoch's measured
// seconds, told to the planner.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>

#include "planner/epoch_planner.h"

namespace tandem::router {

class EpochBook {
 public:
  // planner null: the split never changes, and nothing here is kept.
  EpochBook(planner::EpochPlanner* planner, int64_t epoch_requests)
      : planner_(planner), size_(std::max<int64_t>(1, epoch_requests)) {}
  // The line at `index` opens an epoch (the planner reads it ahead and plans it first).
  bool opens(uint64_t index) const { return planner_ && index % static_cast<uint64_t>(size_) == 0; }
  int64_t size() const { return size_; }
  // The planner numbered the epoch of line `index` so.
  void planned(uint64_t index, int64_t planner_epoch) { planned_[epoch_of(index)] = planner_epoch; }
  void placed(uint64_t i) {
    if (!planner_) return;
    EpochClock& c = clocks_[epoch_of(i)];
    if (!c.started) c.first = Clock::now(), c.started = true;
    ++c.open;
  }
  void finished(uint64_t i) {
    if (!planner_) return;
    EpochClock& c = clocks_[epoch_of(i)];
    c.last = Clock::now();
    if (auto pe = planned_.find(epoch_of(i)); --c.open == 0 && pe != planned_.end())
      planner_->measured(pe->second, std::chrono::duration<double>(c.last - c.first).count());
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct EpochClock {
    Clock::time_point first, last;
    int64_t open = 0;
    bool started = false;
  };
  int64_t epoch_of(uint64_t i) const { return static_cast<int64_t>(i / static_cast<uint64_t>(size_)); }
  planner::EpochPlanner* planner_;
  int64_t size_;
  std::map<int64_t, EpochClock> clocks_;
  std::map<int64_t, int64_t> planned_;  // input epoch -> the planner's
};

}  // namespace tandem::router
