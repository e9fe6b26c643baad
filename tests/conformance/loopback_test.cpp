#include <catch2/catch.hpp>

#include <barrier>
#include <thread>

#include "mpi_transport/loopback/loopback_transport.h"
#include "transport_suite.h"

TEST_CASE("loopback passes the transport conformance suite", "[conformance]") {
  const bool caller_memory = GENERATE(false, true);  // the pool the transport allocates, then the caller's
  auto hub = std::make_shared<tandem::mpi::LoopbackHub>(3);
  std::barrier sync(3);
  std::vector<tandem::conformance::Failures> results(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      tandem::mpi::LoopbackTransport t(hub, r);
      results[static_cast<std::size_t>(r)] = tandem::conformance::run_transport_suite(
          t, [&](const std::function<void()>&) { sync.arrive_and_wait(); }, {}, caller_memory);
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& f : results) {
    CHECK(f.checks > 5);
    for (const auto& failure : f.list) FAIL_CHECK(failure);
  }
}

TEST_CASE("loopback moves row slices between pools of different block sizes", "[conformance]") {
  auto hub = std::make_shared<tandem::mpi::LoopbackHub>(3);
  std::barrier sync(3);
  std::vector<tandem::conformance::Failures> results(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      tandem::mpi::LoopbackTransport t(hub, r);
      results[static_cast<std::size_t>(r)] =
          tandem::conformance::run_slice_suite(t, [&](const std::function<void()>&) { sync.arrive_and_wait(); });
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& f : results) {
    CHECK(f.checks > 3);
    for (const auto& failure : f.list) FAIL_CHECK(failure);
  }
}
