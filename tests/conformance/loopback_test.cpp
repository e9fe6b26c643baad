#include <catch2/catch.hpp>

#include <barrier>
#include <functional>
#include <thread>

#include "mpi_transport/loopback/loopback_transport.h"
#include "relayout_suite.h"
#include "transport_suite.h"

namespace {

using tandem::conformance::Barrier;
using tandem::conformance::Failures;

// Three endpoints of one hub, each on a thread of its own, running `suite`; every rank's failures reported.
void on_three_ranks(const std::function<Failures(tandem::mpi::LoopbackTransport&, const Barrier&)>& suite) {
  auto hub = std::make_shared<tandem::mpi::LoopbackHub>(3);
  std::barrier sync(3);
  const Barrier barrier = [&](const std::function<void()>&) { sync.arrive_and_wait(); };
  std::vector<Failures> results(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      tandem::mpi::LoopbackTransport t(hub, r);
      results[static_cast<std::size_t>(r)] = suite(t, barrier);
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& f : results) {
    CHECK(f.checks > 3);
    for (const auto& failure : f.list) FAIL_CHECK(failure);
  }
}

}  // namespace

TEST_CASE("loopback passes the transport conformance suite", "[conformance]") {
  const bool caller_memory = GENERATE(false, true);  // the pool the transport allocates, then the caller's
  on_three_ranks([caller_memory](tandem::mpi::LoopbackTransport& t, const Barrier& barrier) {
    return tandem::conformance::run_transport_suite(t, barrier, {}, caller_memory);
  });
}

TEST_CASE("loopback moves row slices between pools of different block sizes", "[conformance]") {
  on_three_ranks([](tandem::mpi::LoopbackTransport& t, const Barrier& barrier) {
    return tandem::conformance::run_slice_suite(t, barrier);
  });
}

TEST_CASE("loopback cuts a pool anew into blocks of another size (relayout)", "[conformance]") {
  on_three_ranks([](tandem::mpi::LoopbackTransport& t, const Barrier& barrier) {
    return tandem::conformance::run_relayout_suite(t, barrier);
  });
}
