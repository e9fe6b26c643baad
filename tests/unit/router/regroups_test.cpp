// Rank 0's side of re-splits that change workers' widths (router/regroups.h),
// through its messages: two cells of 2 ranks (prefill workers of 2 ranks,
// decode workers of 1). Only the cell that changes stops work; it is told to
// regroup only once nothing placed on it is out; its new workers are placed
// on only after every worker has the new map; a split asked for meanwhile waits.
#include <map>
#include <set>

#include <catch2/catch.hpp>

#include "router/regroups.h"

using tandem::router::Regroups;
using tandem::topology::Cell;
using tandem::topology::Side;
using tandem::service::MsgType;
using tandem::service::RankReport;

namespace {

struct Sent {
  int rank;
  MsgType type;
  std::vector<uint8_t> bytes;
};

RankReport loaded(int rank, int tp, int64_t blocks) {
  RankReport r;
  r.rank = rank;
  r.tp = tp;
  r.kv_blocks_total = blocks;
  return r;
}

std::vector<int> to(const std::vector<Sent>& sent, MsgType type) {
  std::vector<int> out;
  for (const auto& s : sent)
    if (s.type == type) out.push_back(s.rank);
  return out;
}

// A cell of two forms, running `form`.
Cell cell(tandem::topology::Groups prefill, tandem::topology::Groups decode, Side form) {
  return {{std::move(prefill), std::move(decode)}, form, form};
}

}  // namespace

TEST_CASE("a cell that changes form drains, regroups and comes back while the others keep working") {
  std::vector<Sent> sent;
  // Cell {1,2} prefills (one worker of 2 ranks); cell {3,4} decodes (two workers of 1).
  std::vector<Cell> cells{cell({{1, 2}}, {{1}, {2}}, Side::kPrefill), cell({{3, 4}}, {{3}, {4}}, Side::kDecode)};
  Regroups g(cells, {512, 1024}, [&](int rank, MsgType type, const std::vector<uint8_t>& b) { sent.push_back({rank, type, b}); });
  CHECK(g.keys() == std::vector<int>{1, 3});
  CHECK(g.leaders(Side::kPrefill) == std::vector<int>{1});
  CHECK(g.leaders(Side::kDecode) == std::vector<int>{3, 4});
  for (auto r : {loaded(1, 2, 100), loaded(3, 1, 50), loaded(4, 1, 50)}) g.on_stats(r);

  // Aggregated from now on: cell {1,2} becomes two workers of one rank; {3,4} only hears its role.
  CHECK(g.set_split(1, {}));
  CHECK(to(sent, MsgType::kRoles) == std::vector<int>{3, 4});
  CHECK(g.leaders(Side::kPrefill).empty());
  CHECK(g.leaders(Side::kDecode) == std::vector<int>{3, 4});
  CHECK(g.in_flight());

  std::set<int> busy{1};
  sent.clear();
  CHECK_FALSE(g.step([&](int r) { return busy.contains(r); }));
  CHECK(to(sent, MsgType::kRegroup).empty());  // a request placed there is still out
  busy.clear();
  g.step([&](int r) { return busy.contains(r); });
  CHECK(to(sent, MsgType::kRegroup) == std::vector<int>{1});
  const auto roles = tandem::service::decode_roles(sent.back().bytes);
  CHECK(roles.prefill_ranks.empty());

  // A split asked for meanwhile waits until the cell is back.
  sent.clear();
  CHECK_FALSE(g.set_split(2, {1}));
  CHECK(sent.empty());

  g.on_stats(loaded(1, 2, 100));  // the old worker's counters while it drains: not the new one loaded
  g.on_report(loaded(1, 2, 100));
  g.on_stats(loaded(1, 1, 200));
  g.step([](int) { return false; });
  CHECK(to(sent, MsgType::kGroupMap).empty());  // rank 2's new worker has not reported in
  g.on_stats(loaded(2, 1, 200));
  g.step([](int) { return false; });
  const auto maps = to(sent, MsgType::kGroupMap);
  CHECK(std::set<int>(maps.begin(), maps.end()) == std::set<int>{1, 2, 3, 4});
  const auto map = tandem::service::decode_group_map(sent.back().bytes);
  std::map<int, std::pair<uint64_t, int64_t>> pools;
  for (const auto& grp : map.groups) {
    CHECK_FALSE(grp.prefill);
    pools[grp.ranks.front()] = {grp.block_bytes, grp.blocks};
  }
  CHECK(pools == std::map<int, std::pair<uint64_t, int64_t>>{{1, {1024, 200}}, {2, {1024, 200}}, {3, {1024, 50}}, {4, {1024, 50}}});
  CHECK(g.leaders(Side::kDecode) == std::vector<int>{3, 4});  // not placed on before every worker has the map
  for (int r : {1, 2, 3}) g.on_ack(r, map.serial);
  CHECK_FALSE(g.step([](int) { return false; }));
  g.on_ack(4, map.serial - 1);  // an old map's answer counts for nothing
  CHECK_FALSE(g.step([](int) { return false; }));
  g.on_ack(4, map.serial);
  sent.clear();
  CHECK(g.step([](int) { return false; }));  // back; the split that waited starts now
  CHECK(g.leaders(Side::kDecode) == std::vector<int>{3, 4});
  CHECK(to(sent, MsgType::kRoles) == std::vector<int>{3, 4});
  CHECK(g.in_flight());
  const auto retired = g.take_retired();
  REQUIRE(retired.size() == 1);
  CHECK(retired[0].tp == 2);
}

TEST_CASE("at the end a cell still retiring stays as it was") {
  std::vector<Cell> cells{cell({{1, 2}}, {{1}, {2}}, Side::kPrefill), cell({{3, 4}}, {{3}, {4}}, Side::kDecode)};
  int messages = 0;
  Regroups g(cells, {512, 1024}, [&](int, MsgType, const std::vector<uint8_t>&) { ++messages; });
  g.set_split(1, {});
  g.cancel_retiring();
  CHECK_FALSE(g.in_flight());
  CHECK(g.leaders(Side::kPrefill) == std::vector<int>{1});
  CHECK(g.leaders(Side::kDecode) == std::vector<int>{3, 4});
}

TEST_CASE("while one cell still drains its requests, the map that brings another back keeps its old workers on it") {
  std::vector<Sent> sent;
  // A {1,2} prefills; B {3,4} and C {5,6} decode. The split swaps A and B.
  std::vector<Cell> cells{cell({{1, 2}}, {{1}, {2}}, Side::kPrefill), cell({{3, 4}}, {{3}, {4}}, Side::kDecode), cell({{5, 6}}, {{5}, {6}}, Side::kDecode)};
  Regroups g(cells, {512, 1024}, [&](int rank, MsgType type, const std::vector<uint8_t>& b) { sent.push_back({rank, type, b}); });
  for (auto r : {loaded(1, 2, 100), loaded(3, 1, 30), loaded(4, 1, 40), loaded(5, 1, 50), loaded(6, 1, 60)}) g.on_stats(r);
  CHECK(g.set_split(1, {3}));
  CHECK(g.leaders(Side::kDecode) == std::vector<int>{5, 6});
  const std::set<int> busy{3};  // B's decode worker 3 still holds a request
  g.step([&](int r) { return busy.contains(r); });
  CHECK(to(sent, MsgType::kRegroup) == std::vector<int>{1});
  g.on_report(loaded(1, 2, 100));
  g.on_stats(loaded(1, 1, 200));
  g.on_stats(loaded(2, 1, 200));
  sent.clear();
  g.step([&](int r) { return busy.contains(r); });
  const auto maps = to(sent, MsgType::kGroupMap);
  CHECK(std::set<int>(maps.begin(), maps.end()) == std::set<int>{1, 2, 5, 6});  // not B's: it is told nothing yet
  const auto map = tandem::service::decode_group_map(sent.back().bytes);
  std::map<int, std::pair<uint64_t, int64_t>> pools;
  for (const auto& grp : map.groups) pools[grp.ranks.front()] = {grp.block_bytes, grp.blocks};
  // B's old decode workers stay on it as they are: KV for its request still moves to them.
  CHECK(pools == std::map<int, std::pair<uint64_t, int64_t>>{
                     {1, {1024, 200}}, {2, {1024, 200}}, {3, {1024, 30}}, {4, {1024, 40}}, {5, {1024, 50}}, {6, {1024, 60}}});
  for (int r : {1, 2, 5, 6}) g.on_ack(r, map.serial);
  CHECK(g.step([&](int r) { return busy.contains(r); }));
  CHECK(g.leaders(Side::kDecode) == std::vector<int>{1, 2, 5, 6});
  CHECK(g.take_emptied() == std::vector<int>{1, 2});
  CHECK(g.in_flight());  // B is still on its way
}

TEST_CASE("with one width a worker is a cell of one form: a split changes sides at once, each leader hears its role") {
  std::vector<Sent> sent;
  // Workers {1,2}, {3,4} and {5,6}, each the same in both forms; {1,2} prefills.
  auto same = [](tandem::topology::Groups g, Side s) { return Cell{{g, g}, s, s}; };
  std::vector<Cell> cells{same({{1, 2}}, Side::kPrefill), same({{3, 4}}, Side::kDecode), same({{5, 6}}, Side::kDecode)};
  Regroups g(cells, {1024, 1024}, [&](int rank, MsgType type, const std::vector<uint8_t>& b) { sent.push_back({rank, type, b}); });
  CHECK(g.set_split(1, {5, 3}));
  CHECK_FALSE(g.in_flight());  // nothing regroups
  CHECK(to(sent, MsgType::kRegroup).empty());
  CHECK(to(sent, MsgType::kRoles) == std::vector<int>{1, 3, 5});
  const auto roles = tandem::service::decode_roles(sent.back().bytes);
  CHECK(std::set<int>(roles.prefill_ranks.begin(), roles.prefill_ranks.end()) == std::set<int>{3, 5});
  CHECK(g.leaders(Side::kPrefill) == std::vector<int>{5, 3});  // in the order the split named them
  CHECK(g.leaders(Side::kDecode) == std::vector<int>{1});
  sent.clear();
  CHECK_FALSE(g.set_split(2, {5, 3}));  // the same split: no change, the roles said again
  CHECK(to(sent, MsgType::kRoles) == std::vector<int>{1, 3, 5});
  g.finish([] {}, 1);  // nothing on its way: returns at once
}
