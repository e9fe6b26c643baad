// A fixed pool of compute threads for one worker's forward pass.
//
// run(n, fn) calls fn(i) for i in [0, n) spread over the pool and the caller,
// and returns when all are done. Work is split by index only, so which thread
// computes an element never changes its arithmetic. Idle threads block on a
// condition variable (after a few microseconds of polling, so the ~200 calls
// of one decode step do not each pay a wake-up); they never spin while idle.
// Not reentrant: call run() from one thread at a time. An exception from fn
// (on any thread) is rethrown by run() once every index is done: the first
// one thrown; the pool stays usable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::runtime::cpu {

class ThreadPool {
 public:
  // threads: total including the caller; 0 = the CPUs this process may run on.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  void run(int64_t n, const std::function<void(int64_t)>& fn);

  // CPUs in this process's affinity mask (what Slurm or taskset gave it).
  static int available_cpus();

 private:
  void worker_loop();
  void drain();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> finished_{0};
  std::atomic<uint64_t> generation_{0};
  int active_ = 0;  // workers inside the current generation
  std::exception_ptr error_;  // the current call's first exception (guarded by mutex_)
  bool stop_ = false;
};

}  // namespace tandem::runtime::cpu
