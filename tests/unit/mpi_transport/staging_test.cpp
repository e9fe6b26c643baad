#include <catch2/catch.hpp>

#include "mpi_transport/device_pool.h"

using tandem::mpi::StagingBuffers;

TEST_CASE("staging buffers are recycled, smallest fit first", "[staging]") {
  int64_t allocated_bytes = 0;
  StagingBuffers s([&](std::size_t bytes) {
    allocated_bytes += static_cast<int64_t>(bytes);
    return std::shared_ptr<void>(new uint8_t[bytes], [](void* p) { delete[] static_cast<uint8_t*>(p); });
  });
  auto a = s.take(10000);  // 16 KiB
  auto b = s.take(100000);  // 128 KiB
  REQUIRE(a.capacity == 16384);
  REQUIRE(b.capacity == 131072);
  REQUIRE(s.allocations() == 2);
  const void* small = a.data();
  s.give_back(std::move(a));
  s.give_back(std::move(b));
  auto c = s.take(5000);  // fits both: the smaller is taken
  REQUIRE(c.data() == small);
  auto d = s.take(20000);  // the 128 KiB one
  REQUIRE(d.capacity == 131072);
  REQUIRE(s.allocations() == 2);
  auto e = s.take(200000);  // nothing kept fits
  REQUIRE(e.capacity == 262144);
  REQUIRE(s.allocations() == 3);
  REQUIRE(allocated_bytes == 16384 + 131072 + 262144);
}

TEST_CASE("staging keeps at most kKeep buffers, dropping the smallest", "[staging]") {
  StagingBuffers s;
  std::vector<StagingBuffers::Buffer> held;
  for (std::size_t i = 0; i < StagingBuffers::kKeep + 2; ++i) held.push_back(s.take(4096u << i));
  for (auto& b : held) s.give_back(std::move(b));
  // The two smallest went: a 4 KiB request now gets the smallest kept, 16 KiB.
  REQUIRE(s.take(1).capacity == 16384);
  REQUIRE(s.allocations() == static_cast<int64_t>(StagingBuffers::kKeep + 2));
}
