#include <catch2/catch.hpp>

#include <numeric>

#include "kv/block_hash.h"
#include "kv/block_pool.h"

using namespace tandem::kv;

TEST_CASE("block hashes chain: equal hashes mean equal prefixes", "[kv]") {
  std::vector<int32_t> a(40), b(40);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 0);
  b[20] = 999;  // differs in the second block
  const auto ha = full_block_hashes(a, 16), hb = full_block_hashes(b, 16);
  REQUIRE(ha.size() == 2);  // 40 tokens: two full blocks, the partial one has no hash
  CHECK(ha[0] == hb[0]);
  CHECK(ha[1] != hb[1]);
  // The same block after another prefix hashes differently.
  std::vector<int32_t> c(a.begin() + 16, a.begin() + 32);
  CHECK(block_hash(kRootHash, c) != ha[1]);
}

TEST_CASE("the prefix cache keeps released blocks, finds them by hash, and evicts LRU", "[kv]") {
  BlockPool pool({1, 1, 8, 4}, 4);
  auto a = *pool.allocate(2);
  pool.publish(a[0], 111);
  pool.publish(a[1], 222);
  CHECK(pool.num_free() == 2);
  pool.release(a);
  CHECK(pool.num_free() == 4);  // cached blocks are evictable, so they count as free
  CHECK(pool.num_cached() == 2);

  const uint64_t want[] = {111, 222, 333};
  auto hit = pool.lookup(want);
  CHECK(hit == a);  // the longest cached prefix, in order
  CHECK(pool.num_free() == 2);
  pool.release(hit);

  // Taking all four blocks evicts the cached ones, least recently used first.
  auto all = *pool.allocate(4);
  CHECK(all.size() == 4);
  CHECK(pool.num_cached() == 0);
  CHECK_FALSE(pool.allocate(1).has_value());
  const uint64_t again[] = {111};
  CHECK(pool.lookup(again).empty());
  pool.release(all);
  CHECK(pool.num_free() == 4);
}

TEST_CASE("a shared block stays in use until its last user releases it", "[kv]") {
  BlockPool pool({1, 1, 8, 4}, 2);
  auto a = *pool.allocate(1);
  pool.publish(a[0], 7);
  const uint64_t h[] = {7};
  auto b = pool.lookup(h);  // a second user
  REQUIRE(b == a);
  pool.release(a);
  CHECK(pool.num_free() == 1);  // still referenced by b
  pool.release(b);
  CHECK(pool.num_free() == 2);
}
