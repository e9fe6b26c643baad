// Work done on helper threads and handed back in the order it was given:
// the owner's thread pushes items, the helpers run `work` on them (any
// number at once), and the owner pops them in push order, waiting for the
// front one when it is not done yet. Rank 0 prepares its input lines this
// way (parse, tokenize) while its main thread stays the only one that
// reads the file, writes the output and calls MPI.
//
// With no helper threads the work runs on the owner's thread, at pop. An
// exception thrown by `work` comes back from the pop of its item. Only the
// owner's thread may call push, pop and size. Idle helpers block on a
// condition variable (no spinning).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace tandem {

template <class T>
class OrderedPool {
 public:
  OrderedPool(int threads, std::function<void(T&)> work) : work_(std::move(work)) {
    for (int k = 0; k < threads; ++k) helpers_.emplace_back([this] { help(); });
  }
  OrderedPool(const OrderedPool&) = delete;
  OrderedPool& operator=(const OrderedPool&) = delete;
  // Items not popped yet are dropped; work under way finishes first.
  ~OrderedPool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : helpers_) t.join();
  }

  int threads() const { return static_cast<int>(helpers_.size()); }
  // Pushed and not popped yet.
  std::size_t size() const { return order_.size(); }

  void push(T item) {
    order_.push_back(std::make_unique<Slot>(std::move(item)));
    if (helpers_.empty()) return;
    {
      std::lock_guard lock(mutex_);
      todo_.push_back(order_.back().get());
    }
    wake_.notify_one();
  }

  // The oldest item, worked on. Precondition: size() > 0. When it is not
  // done yet, waits for the next few to be done too (4 per helper), so that
  // the owner sleeps and wakes once per few items, not once per item (a
  // wake-up costs more than a short line's work on a virtual machine).
  T pop() {
    Slot& s = *order_.front();
    if (helpers_.empty()) {
      run(s);
    } else {
      std::unique_lock lock(mutex_);
      if (!s.done) {
        const std::size_t ahead = std::min(order_.size(), 4 * helpers_.size()) - 1;
        awaited_ = order_[ahead].get();
        done_.wait(lock, [&] { return awaited_->done; });
        awaited_ = &s;  // with several helpers the front one may still be under way
        done_.wait(lock, [&] { return s.done; });
        awaited_ = nullptr;
      }
    }
    T out = std::move(s.item);
    const std::exception_ptr error = s.error;
    order_.pop_front();
    if (error) std::rethrow_exception(error);
    return out;
  }

 private:
  struct Slot {
    explicit Slot(T i) : item(std::move(i)) {}
    T item;
    bool done = false;  // guarded by mutex_ when there are helpers
    std::exception_ptr error;
  };

  void run(Slot& s) {
    try {
      work_(s.item);
    } catch (...) {
      s.error = std::current_exception();
    }
  }

  void help() {
    for (;;) {
      Slot* s = nullptr;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !todo_.empty(); });
        if (stop_) return;
        s = todo_.front();
        todo_.pop_front();
      }
      run(*s);
      bool wake = false;
      {
        std::lock_guard lock(mutex_);
        s->done = true;
        wake = s == awaited_;
      }
      if (wake) done_.notify_one();
    }
  }

  std::function<void(T&)> work_;
  std::deque<std::unique_ptr<Slot>> order_;  // the owner's; a helper touches only the slot it took
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<Slot*> todo_;
  Slot* awaited_ = nullptr;  // the owner sleeps until this one is done
  bool stop_ = false;
  std::vector<std::thread> helpers_;  // last: started once everything above exists, joined first
};

}  // namespace tandem
