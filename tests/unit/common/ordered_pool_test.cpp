#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>

#include "common/ordered_pool.h"

using tandem::OrderedPool;

namespace {

struct Item {
  int n = 0;
  int squared = 0;
  std::thread::id by;
};

}  // namespace

TEST_CASE("OrderedPool hands items back in push order, whatever order the helpers finish in", "[common]") {
  for (int threads : {0, 1, 3}) {
    std::atomic<int> running{0}, most{0};
    OrderedPool<Item> pool(threads, [&](Item& it) {
      const int now = ++running;
      for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
      }
      // Early items take longest: helpers finish them after later ones.
      std::this_thread::sleep_for(std::chrono::microseconds(50 * (it.n % 7 == 0 ? 20 : 1)));
      it.squared = it.n * it.n;
      it.by = std::this_thread::get_id();
      --running;
    });
    CHECK(pool.threads() == threads);
    std::set<std::thread::id> workers;
    int next = 0;
    for (int n = 0; n < 200; ++n) {
      pool.push({n, 0, {}});
      if (pool.size() >= 8) {
        Item it = pool.pop();
        CHECK(it.n == next);
        CHECK(it.squared == next * next);
        workers.insert(it.by);
        ++next;
      }
    }
    while (pool.size() > 0) {
      Item it = pool.pop();
      CHECK(it.n == next);
      CHECK(it.squared == next * next);
      workers.insert(it.by);
      ++next;
    }
    CHECK(next == 200);
    if (threads == 0) {
      CHECK(workers == std::set<std::thread::id>{std::this_thread::get_id()});
    } else {
      CHECK_FALSE(workers.contains(std::this_thread::get_id()));
      CHECK(workers.size() <= static_cast<std::size_t>(threads));
      CHECK(most.load() <= threads);
    }
  }
}

TEST_CASE("OrderedPool returns a worker's exception from the pop of its item, and goes on", "[common]") {
  for (int threads : {0, 2}) {
    OrderedPool<int> pool(threads, [](int& n) {
      if (n == 3) throw std::runtime_error("three");
      n *= 10;
    });
    for (int n = 0; n < 6; ++n) pool.push(n);
    CHECK(pool.pop() == 0);
    CHECK(pool.pop() == 10);
    CHECK(pool.pop() == 20);
    CHECK_THROWS_WITH(pool.pop(), "three");
    CHECK(pool.pop() == 40);
    CHECK(pool.pop() == 50);
    CHECK(pool.size() == 0);
  }
}

TEST_CASE("OrderedPool, destroyed with items pending, finishes the work under way and starts no more", "[common]") {
  std::atomic<int> started{0}, done{0};
  {
    OrderedPool<int> pool(2, [&](int&) {
      ++started;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ++done;
    });
    for (int n = 0; n < 50; ++n) pool.push(n);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(done.load() == started.load());  // nothing left half-done behind the pool's back
  CHECK(started.load() < 50);            // 50 x 20 ms on 2 helpers would take 500 ms
}
