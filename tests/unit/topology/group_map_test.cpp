// Which ranks make up each tensor-parallel worker: rank order, and placed by node.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "topology/group_map.h"

using tandem::topology::GroupMap;
using tandem::topology::place_by_node;
using tandem::topology::Side;
using Groups = std::vector<std::vector<int>>;

namespace {

// hosts[r]: the node of world rank r, from a string such as "AABBB".
std::vector<std::string> nodes(const std::string& letters) {
  std::vector<std::string> out;
  for (char c : letters) out.push_back(std::string("node") + c);
  return out;
}

Groups groups(const GroupMap& m, Side side) {
  Groups out;
  for (int leader : m.leaders(side)) out.push_back(m.members(leader));
  return out;
}

}  // namespace

TEST_CASE("group map in rank order: prefill groups, then decode groups of their own width") {
  const GroupMap m(4, 2, 3, 1);  // ranks 1-4 prefill in pairs, 5-7 decode alone
  CHECK(groups(m, Side::kPrefill) == Groups{{1, 2}, {3, 4}});
  CHECK(groups(m, Side::kDecode) == Groups{{5}, {6}, {7}});
  CHECK(m.leader_of(4) == 3);
  CHECK(m.place_of(4) == 1);
  CHECK(m.width_at(4) == 2);
  CHECK(m.width_at(6) == 1);
  CHECK(m.side_at(2) == Side::kPrefill);
  CHECK(m.side_at(5) == Side::kDecode);
  CHECK(m.member(3, 1) == 4);
  // Rank 0 routes: a group of its own, in no role.
  CHECK(m.leader_of(0) == 0);
  CHECK(m.width_at(0) == 1);
  CHECK(m.side_at(0) == Side::kDecode);
  CHECK(m.spanning(nodes("AAAAABBB")) == Groups{});
  CHECK(m.spanning(nodes("AABBBBBB")) == Groups{{1, 2}});
}

TEST_CASE("explicit groups: the lowest rank leads, the others follow in rank order") {
  const GroupMap m({{7, 3, 5}}, {{6, 2, 4}});
  CHECK(m.leaders(Side::kPrefill) == std::vector<int>{3});
  CHECK(m.leaders(Side::kDecode) == std::vector<int>{2});
  CHECK(m.members(7) == std::vector<int>{3, 5, 7});
  CHECK(m.place_of(7) == 2);
  CHECK(m.member(2, 2) == 6);
  CHECK(GroupMap::describe({3, 5, 7}) == "3, 5, 7");
  CHECK(GroupMap::describe({4, 5, 6, 7}) == "4-7");
  CHECK(GroupMap::describe({9}) == "9");
}

TEST_CASE("placed by node: ranks that rank order already keeps on their nodes stay as they are") {
  // srun -N 2 --ntasks=9: 5 + 4 tasks; workers of 4 at ranks 1-4 and 5-8.
  const auto hosts = nodes("AAAAABBBB");
  const GroupMap m = place_by_node(hosts, 4, 4, 4, 4, false);
  CHECK(groups(m, Side::kPrefill) == Groups{{1, 2, 3, 4}});
  CHECK(groups(m, Side::kDecode) == Groups{{5, 6, 7, 8}});
  // One rank per worker, alternating nodes: one prefill on each (B holds 3 workers, A 2).
  const GroupMap singles = place_by_node(nodes("ABABAB"), 2, 1, 3, 1, false);
  CHECK(groups(singles, Side::kPrefill) == Groups{{1}, {2}});
  // On one node, always rank order.
  const GroupMap one = place_by_node(nodes("AAAAAAA"), 2, 2, 4, 2, false);
  CHECK(one == GroupMap(2, 2, 4, 2));
}

TEST_CASE("placed by node: each node prefills and decodes in the job's proportion, so KV can stay on it") {
  // sbatch -N 2 --ntasks=8 (block): ranks 0-3 on A, 4-7 on B; 3 prefill, 4 decode. Rank order would
  // prefill on A only (every prompt's KV crossing to B); spread, A prefills 1 of its 3, B 2 of its 4.
  const auto hosts = nodes("AAAABBBB");
  const GroupMap m = place_by_node(hosts, 3, 1, 4, 1, false);
  CHECK(groups(m, Side::kPrefill) == Groups{{1}, {4}, {5}});
  CHECK(groups(m, Side::kDecode) == Groups{{2}, {3}, {6}, {7}});
  // cluster.placement = "rank" (or a heterogeneous job): ranks 1..3 prefill.
  CHECK(place_by_node(hosts, 3, 1, 4, 1, true) == GroupMap(3, 1, 4, 1));
  // Workers of two ranks: one prefill worker on each node, each worker on one node.
  const auto nine = nodes("AAAAABBBB");
  const GroupMap pairs = place_by_node(nine, 4, 2, 4, 2, false);
  CHECK(groups(pairs, Side::kPrefill) == Groups{{1, 2}, {5, 6}});
  CHECK(groups(pairs, Side::kDecode) == Groups{{3, 4}, {7, 8}});
  CHECK(pairs.spanning(nine).empty());
}

TEST_CASE("placed by node: a cyclic layout (mpirun --map-by node) gets every group on one node") {
  // Ranks alternate between two nodes: rank order would split every group.
  const auto hosts = nodes("ABABABABA");
  REQUIRE(GroupMap(4, 4, 4, 4).spanning(hosts).size() == 2);
  const GroupMap m = place_by_node(hosts, 4, 4, 4, 4, false);
  CHECK(m.spanning(hosts).empty());
  CHECK(groups(m, Side::kPrefill) == Groups{{1, 3, 5, 7}});   // node B's ranks (it holds the lowest worker rank)
  CHECK(groups(m, Side::kDecode) == Groups{{2, 4, 6, 8}});  // node A's
  // Aggregated, decode_tp 2: pairs within each node.
  const GroupMap agg = place_by_node(hosts, 0, 1, 8, 2, false);
  CHECK(agg.spanning(hosts).empty());
  CHECK(groups(agg, Side::kDecode) == Groups{{1, 3}, {2, 4}, {5, 7}, {6, 8}});
}

TEST_CASE("placed by node: where the allocation cannot keep a group on one node, the fewest groups span") {
  // 4 + 4 + 1 slots: rank 0 shifts rank order so both workers span; by node only one must.
  const auto hosts = nodes("AAAABBBBC");
  REQUIRE(GroupMap(4, 4, 4, 4).spanning(hosts).size() == 2);
  const GroupMap m = place_by_node(hosts, 4, 4, 4, 4, false);
  CHECK(m.spanning(hosts) == Groups{{1, 2, 3, 8}});
  CHECK(groups(m, Side::kPrefill) == Groups{{4, 5, 6, 7}});  // the first whole node's ranks prefill
  // Different widths: prefill's wide worker takes a whole node first, decode's singles fill the rest.
  const GroupMap mixed = place_by_node(nodes("AAABBBB"), 4, 4, 2, 1, false);
  CHECK(groups(mixed, Side::kPrefill) == Groups{{3, 4, 5, 6}});
  CHECK(groups(mixed, Side::kDecode) == Groups{{1}, {2}});
}

TEST_CASE("placed by node, roles kept (a heterogeneous job): each role regroups within its own ranks") {
  // Component 0 (router and prefill) on node A; component 1 (decode) on B and C, interleaved.
  const auto hosts = nodes("AAABCBC");
  const GroupMap m = place_by_node(hosts, 2, 2, 4, 2, true);
  CHECK(groups(m, Side::kPrefill) == Groups{{1, 2}});
  CHECK(groups(m, Side::kDecode) == Groups{{3, 5}, {4, 6}});
  CHECK(m.spanning(hosts).empty());
  // Without the rule the same ranks could trade roles; with it the prefill ranks stay 1..P even if one group spans.
  const auto split = nodes("AABBBB");  // prefill ranks 1, 2 on A and B
  const GroupMap kept = place_by_node(split, 2, 2, 3, 1, true);
  CHECK(groups(kept, Side::kPrefill) == Groups{{1, 2}});
  const GroupMap free = place_by_node(split, 2, 2, 3, 1, false);
  CHECK(free.spanning(split).empty());
  CHECK(groups(free, Side::kPrefill) == Groups{{2, 3}});
}

TEST_CASE("leaders by node: every prefix of the order takes from each node in proportion") {
  const auto hosts = nodes("AAAABBBB");  // workers 1-3 on A, 4-7 on B
  const GroupMap m(0, 1, 7, 1);
  CHECK(m.leaders_by_node(hosts) == std::vector<int>{4, 1, 5, 2, 6, 3, 7});
  // One node: rank order.
  CHECK(m.leaders_by_node(nodes("AAAAAAAA")) == std::vector<int>{1, 2, 3, 4, 5, 6, 7});
}
