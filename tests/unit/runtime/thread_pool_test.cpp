// The compute threads' pool (runtime/cpu/thread_pool.h): what run() promises about a task that throws.
#include <catch2/catch.hpp>

#include <atomic>
#include <stdexcept>
#include <string>

#include "runtime/cpu/thread_pool.h"

using namespace tandem::runtime;

TEST_CASE("thread pool: an exception in a task comes out of run(), after every task, and the pool goes on",
          "[engine][threads]") {
  cpu::ThreadPool threads(2);
  for (int round = 0; round < 20; ++round) {  // the throwing task lands on either thread
    std::atomic<int64_t> done{0};
    const int64_t bad = round % 8;
    REQUIRE_THROWS_WITH(threads.run(8,
                                    [&](int64_t i) {
                                      if (i == bad) throw std::runtime_error("task " + std::to_string(i));
                                      done.fetch_add(1);
                                    }),
                        "task " + std::to_string(bad));
    CHECK(done.load() == 7);  // the other tasks all ran
  }
  std::atomic<int64_t> sum{0};
  threads.run(100, [&](int64_t i) { sum.fetch_add(i); });
  CHECK(sum.load() == 4950);
}
