// Idle loops never spin: Backoff sleeps a little longer each time nothing
// happened (50 us, doubling up to 2 ms, or to a cap of the caller's) and
// starts over after something did. The cores are shared by every rank of a node.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace tandem {

class Backoff {
 public:
  void idle(int cap_us = 2000) {
    us_ = us_ == 0 ? 50 : std::min(us_ * 2, std::max(50, cap_us));
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
  }
  void reset() { us_ = 0; }

 private:
  int us_ = 0;
};

}  // namespace tandem
