#include "runtime/cpu/thread_pool.h"

#include <sched.h>

#include <chrono>
#include <utility>

namespace tandem::runtime::cpu {

int ThreadPool::available_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = available_cpus();
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain() {
  for (int64_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) {
    try {
      (*fn_)(i);
    } catch (...) {  // kept for run() to rethrow: an exception leaving a worker would end the process
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    finished_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::run(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    fn_ = &fn;
    n_ = n;
    next_.store(0);
    finished_.store(0);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  drain();
  // Wait for the stragglers, then for every worker to leave this generation.
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return finished_.load(std::memory_order_acquire) == n_ && active_ == 0; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Poll briefly for the next call (steps come back to back), then block.
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    while (generation_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
    if (stop_) return;
    seen = generation_.load();
    if (!fn_) continue;
    ++active_;
    lock.unlock();
    drain();
    lock.lock();
    --active_;
    if (active_ == 0) done_.notify_all();
  }
}

}  // namespace tandem::runtime::cpu
