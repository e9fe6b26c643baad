// Who is where, as data: the split (plan_roles), cells and their two forms,
// a rank's place and where a regroup takes it. No MPI, no model.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/error.h"
#include "topology/cells.h"
#include "topology/place.h"
#include "topology/roles.h"

using namespace tandem::topology;
using tandem::Error;

namespace {

Ask ask(Mode mode, int prefill_tp, int decode_tp, int64_t prefill_ranks = 0, int64_t decode_ranks = 0) {
  return {mode, {prefill_tp, decode_tp}, {prefill_ranks, decode_ranks}, 0.5};
}

std::string error_of(const Ask& a, int world) {
  try {
    plan_roles(a, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the split: aggregated, disaggregated by the prefill fraction, and by counts") {
  const Roles agg = plan_roles(ask(Mode::kAgg, 1, 2), 5);
  CHECK_FALSE(agg.disaggregated());
  CHECK(agg.ranks == BySide<int>{0, 4});
  CHECK(agg.leaders(Side::kDecode) == std::vector<int>{1, 3});
  CHECK(agg.workers() == 2);

  const Roles dis = plan_roles(ask(Mode::kDisagg, 1, 1), 5);  // 4 workers, half prefill
  CHECK(dis.ranks == BySide<int>{2, 2});
  CHECK(dis.leaders(Side::kPrefill) == std::vector<int>{1, 2});
  CHECK(dis.group_of(3).side == Side::kDecode);
  CHECK(dis.group_of(0).width == 1);  // rank 0 routes: a group of its own

  const Roles counted = plan_roles(ask(Mode::kDisagg, 2, 1, 4), 8);
  CHECK(counted.ranks == BySide<int>{4, 3});
  CHECK(counted.map().members(3) == std::vector<int>{3, 4});
  CHECK(counted.group_of(4).place == 1);
  CHECK(counted.workers() == 5);

  CHECK(plan_roles(ask(Mode::kDisagg, 1, 1), 2).ranks == BySide<int>{0, 1});  // one worker: aggregated
}

TEST_CASE("a split that cannot be is one line naming the key to change") {
  CHECK(error_of(ask(Mode::kAgg, 1, 2), 4).find("not whole workers of 2 ranks") != std::string::npos);
  CHECK(error_of(ask(Mode::kDisagg, 1, 1, 3, 3), 5).find("do not split the 4 worker ranks") != std::string::npos);
  CHECK(error_of(ask(Mode::kDisagg, 1, 1, 4), 5).find("cluster.prefill_ranks = 4 leaves no decode rank") != std::string::npos);
  CHECK(error_of(ask(Mode::kAuto, 2, 1), 6).find("cells of 2 ranks") != std::string::npos);  // 5 workers
  CHECK(error_of(ask(Mode::kDisagg, 2, 1, 3), 6).find("not a multiple of cluster.prefill_tp") != std::string::npos);
  CHECK(error_of(ask(Mode::kAgg, 1, 4), 3).find("needs at least 5 ranks") != std::string::npos);
}

TEST_CASE("two widths under the planner make cells of lcm(prefill_tp, decode_tp) ranks, each in one of two forms") {
  const Ask a = ask(Mode::kAuto, 2, 1);
  const Roles r = plan_roles(a, 5);
  REQUIRE(planned_job(a, r, 5));
  REQUIRE(cell_ranks(a, r, 5) == 2);
  CHECK(cell_ranks(ask(Mode::kAuto, 4, 6), plan_roles(ask(Mode::kAuto, 4, 6), 25), 25) == 12);
  CHECK(cell_ranks(ask(Mode::kAuto, 2, 2), plan_roles(ask(Mode::kAuto, 2, 2), 5), 5) == 0);  // one width: no cells
  CHECK(cell_ranks(ask(Mode::kDisagg, 2, 1), plan_roles(ask(Mode::kDisagg, 2, 1), 5), 5) == 0);  // not planned
  const auto cells = job_cells(r, 2);
  REQUIRE(cells.size() == 2);
  CHECK(cells[0].key() == 1);
  CHECK(cells[0].groups(Side::kPrefill) == Groups{{1, 2}});
  CHECK(cells[0].groups(Side::kDecode) == Groups{{1}, {2}});
  CHECK(cells[0].form == Side::kPrefill);
  CHECK(cells[1].form == Side::kDecode);
  CHECK_FALSE(cells[0].one_form());
  CHECK_FALSE(cells[0].regrouping());
  CHECK(cell_key(4, 2) == 3);
  CHECK(cell_groups(5, 4, 2) == Groups{{5, 6}, {7, 8}});
}

TEST_CASE("with one width every worker is a cell of one form, on its side, in rank order") {
  const Roles r = plan_roles(ask(Mode::kAuto, 2, 2), 7);  // 6 workers: one prefill pair, two decode pairs
  const auto cells = job_cells(r, 0);
  REQUIRE(cells.size() == 3);
  for (const Cell& c : cells) CHECK(c.one_form());
  CHECK(cells[0].groups(Side::kPrefill) == Groups{{1, 2}});
  CHECK(cells[0].form == Side::kPrefill);
  CHECK(cells[2].key() == 5);
  CHECK(cells[2].form == Side::kDecode);
}

TEST_CASE("a regroup takes a cell's rank to its other form; every other worker stays where it was") {
  const Ask a = ask(Mode::kAuto, 2, 1);  // cells {1,2} (prefill: one pair) and {3,4} (decode: two singles)
  const Roles r = plan_roles(a, 5);
  const Place two = place_of(2, r, true, true, cell_ranks(a, r, 5));
  CHECK(two.regroups());
  CHECK(two.disaggregated);
  CHECK(two.group.width == 2);
  CHECK(two.group.place == 1);
  CHECK(two.side() == Side::kPrefill);
  CHECK(two.other.width == 1);
  CHECK(two.other.side == Side::kDecode);
  CHECK(two.other_leader() == 2);
  CHECK(place_of(4, r, true, true, 2).other_leader() == 3);

  // Every cell decodes from now on (aggregated): rank 2 leads a worker of its own.
  const Place next = regroup(two, {});
  CHECK(next.side() == Side::kDecode);
  CHECK(next.group.width == 1);
  CHECK(next.group.place == 0);
  CHECK(next.other.width == 2);
  CHECK(next.incarnation == 1);
  CHECK_FALSE(next.disaggregated);
  CHECK(next.roles.map().groups(Side::kPrefill).empty());
  CHECK(next.roles.map().groups(Side::kDecode) == Groups{{1}, {2}, {3}, {4}});
  CHECK(next.roles.map().leader_of(2) == 2);

  // And back: the map is the first one again.
  const Place back = regroup(next, {1});
  CHECK(back.roles.map() == r.map());
  CHECK(back.side() == Side::kPrefill);
  CHECK(back.group.place == 1);
  CHECK(back.incarnation == 2);

  // A word that leaves this cell in the form it has is a bug, said as one.
  CHECK_THROWS_WITH(regroup(two, {1}), Catch::Contains("the form it has"));
  CHECK_THROWS_WITH(regroup(place_of(1, plan_roles(ask(Mode::kAuto, 1, 1), 5), true, true, 0), {}),
                    Catch::Contains("in no cell"));
}

TEST_CASE("sides are named, and a BySide is reached by them") {
  CHECK(other(Side::kPrefill) == Side::kDecode);
  CHECK(side_name(Side::kDecode) == "decode");
  BySide<int> n{1, 2};
  n[Side::kDecode] += 5;
  CHECK(n.prefill == 1);
  CHECK(n.decode == 7);
}
