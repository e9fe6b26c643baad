#include <catch2/catch.hpp>

#include "router/kv_aware_policy.h"
#include "router/placement.h"
#include "router/prefix_order.h"

using namespace tandem::router;

TEST_CASE("KV-aware routing follows Dynamo's cost, ties to the lowest rank", "[router]") {
  const RouteWeights w;
  struct Row {
    const char* what;
    std::vector<Candidate> candidates;
    int64_t prompt_blocks;
    int want_rank;
  };
  const std::vector<Row> table = {
      {"all equal: lowest rank", {{3, 0, 0, 0, 0}, {1, 0, 0, 0, 0}, {2, 0, 0, 0, 0}}, 10, 1},
      {"cached prefix wins", {{1, 0, 0, 0, 0}, {2, 8, 0, 0, 0}}, 10, 2},
      {"cache outweighed by load", {{1, 0, 0, 0, 0}, {2, 8, 50, 5, 0}}, 10, 1},
      {"more overlap beats less", {{1, 4, 2, 1, 0}, {2, 9, 2, 1, 0}}, 10, 2},
      {"overlap beyond the prompt does not go negative", {{1, 30, 5, 0, 0}, {2, 10, 0, 0, 0}}, 10, 2},
      {"queued prefill tokens count", {{1, 0, 0, 0, 1600}, {2, 0, 0, 0, 0}}, 10, 2},
      // Tiers: 8 blocks in host memory (0.75 each) beat 5 in the pool; 8 on disk (0.25 each) do not.
      {"host blocks count at 0.75", {{1, 5, 0, 0, 0}, {2, 0, 0, 0, 0, 8, 0}}, 10, 2},
      {"disk blocks count at 0.25", {{1, 5, 0, 0, 0}, {2, 0, 0, 0, 0, 0, 8}}, 10, 1},
      {"disk blocks still beat nothing", {{1, 0, 0, 0, 0}, {2, 0, 0, 0, 0, 0, 8}}, 10, 2},
  };
  for (const auto& row : table) {
    INFO(row.what);
    const auto i = choose_worker(RoutePolicy::kKvAware, row.candidates, row.prompt_blocks, w, 0);
    CHECK(row.candidates[i].rank == row.want_rank);
  }
}

TEST_CASE("a remote prefill prefers the decode worker's node unless the other node is the less loaded by more", "[router]") {
  // Two nodes: ranks 1 and 3 on node 1, ranks 2 and 4 on node 0. Prefill workers 1, 2; decode workers 3, 4.
  PlacementOptions o;
  o.block_size = 16;
  o.local_prefill_tokens = 16;
  o.node_of = {0, 1, 0, 1, 0};
  const std::vector<Candidate> decode = {{3, 0, 8, 1, 0}, {4, 0, 0, 0, 0}};  // 4 is the less loaded: chosen
  std::vector<Candidate> prefill = {{1, 0, 0, 0, 0}, {2, 0, 0, 0, 0}};
  PlacementChoice c = place(160, decode, prefill, o, 0);  // 10 blocks to send
  CHECK(decode[c.worker].rank == 4);
  CHECK(prefill[static_cast<std::size_t>(c.prefill)].rank == 2);  // on node 0 with it, though rank 1 is lower
  // Nodes unknown, or a weight of 0: the lowest rank, as on one node.
  o.weights.kv_between_nodes = 0;
  c = place(160, decode, prefill, o, 0);
  CHECK(prefill[static_cast<std::size_t>(c.prefill)].rank == 1);
  o.weights.kv_between_nodes = 0.5;
  o.node_of.clear();
  c = place(160, decode, prefill, o, 0);
  CHECK(prefill[static_cast<std::size_t>(c.prefill)].rank == 1);
  // Rank 2 has 96 prompt tokens queued (6 blocks of work) > 0.5 x 10 blocks sent: rank 1, across the nodes.
  o.node_of = {0, 1, 0, 1, 0};
  prefill[1].queued_tokens = 96;
  c = place(160, decode, prefill, o, 0);
  CHECK(prefill[static_cast<std::size_t>(c.prefill)].rank == 1);
  prefill[1].queued_tokens = 64;  // 4 blocks < 5: still its own node
  c = place(160, decode, prefill, o, 0);
  CHECK(prefill[static_cast<std::size_t>(c.prefill)].rank == 2);
}

TEST_CASE("round robin and least loaded", "[router]") {
  const std::vector<Candidate> c = {{1, 9, 0, 3, 0}, {2, 0, 0, 1, 0}, {3, 0, 0, 1, 0}};
  CHECK(choose_worker(RoutePolicy::kRoundRobin, c, 4, {}, 0) == 0);
  CHECK(choose_worker(RoutePolicy::kRoundRobin, c, 4, {}, 4) == 1);
  CHECK(c[choose_worker(RoutePolicy::kLeastLoaded, c, 4, {}, 0)].rank == 2);
  CHECK_THROWS_WITH(parse_route_policy("random"), Catch::Contains("router.policy must be"));
}

TEST_CASE("the KV index follows stored and removed hashes per worker", "[router]") {
  KvIndex index;
  const uint64_t prompt[] = {11, 22, 33, 44};
  const uint64_t stored[] = {11, 22, 44};
  index.stored(2, stored);
  CHECK(index.overlap(2, prompt).device == 2);  // 33 is missing: the prefix stops there
  CHECK(index.overlap(1, prompt).total() == 0);
  const uint64_t gone[] = {11};
  index.removed(2, gone);
  CHECK(index.overlap(2, prompt).total() == 0);
  CHECK(index.overlap(9, prompt).total() == 0);
}

TEST_CASE("the KV index counts each leading block at the fastest tier holding it", "[router]") {
  KvIndex index;
  const uint64_t prompt[] = {1, 2, 3, 4, 5};
  const uint64_t dev[] = {1}, host[] = {2, 4}, disk[] = {3, 4};
  index.stored(1, dev);
  index.stored(1, host, KvIndex::Where::kHost);
  index.stored_on_disk(disk);
  const Overlap o = index.overlap(1, prompt);
  CHECK(o.device == 1);
  CHECK(o.host == 2);  // block 4 is in host memory and on disk: host counts
  CHECK(o.disk == 1);
  CHECK(o.total() == 4);  // 5 is nowhere
  CHECK(index.overlap(2, prompt).total() == 0);  // another worker: not its pool, and block 1 is on no disk
  const uint64_t more[] = {1, 2};
  index.stored_on_disk(more);
  CHECK(index.overlap(2, prompt).disk == 4);  // the store is every worker's
  index.removed(1, host, KvIndex::Where::kHost);
  CHECK(index.overlap(1, prompt).host == 0);
}

TEST_CASE("reordering: the request sharing the longest prefix with the last one goes next, else the oldest",
          "[router]") {
  const std::vector<uint64_t> a1 = {1, 2, 3}, b1 = {7, 8}, a2 = {1, 2, 4}, a3 = {1, 9}, c = {5};
  std::vector<std::span<const uint64_t>> window = {b1, a3, a2, c};
  const std::vector<uint64_t> none;
  CHECK(next_by_shared_prefix(window, a1) == 2);    // a2 shares two blocks, a3 one
  CHECK(next_by_shared_prefix(window, none) == 0);  // nothing placed yet: the oldest
  CHECK(next_by_shared_prefix(window, c) == 3);
  const std::vector<uint64_t> d = {42};
  CHECK(next_by_shared_prefix(window, d) == 0);  // nothing shared: the oldest
  CHECK(next_by_shared_prefix(std::span<const std::span<const uint64_t>>(window).first(1), a1) == 0);
}
