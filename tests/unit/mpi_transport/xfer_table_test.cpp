#include <catch2/catch.hpp>

#include <vector>

#include "mpi_transport/xfer_table.h"

using tandem::mpi::XferTable;

namespace {
struct Entry {
  int peer = 0;
  std::vector<int> buffer;
  void reset() {
    peer = 0;
    buffer.clear();
  }
};
}  // namespace

TEST_CASE("the transfer table finds and forgets its entries, and reuses their slots", "[xfer_table]") {
  XferTable<Entry> t;
  for (int64_t id = 1; id <= 4; ++id) t.add(id).peer = static_cast<int>(id * 10);
  REQUIRE(t.size() == 4);
  REQUIRE(t.find(3)->second.peer == 30);
  REQUIRE(t.find(9) == t.end());
  REQUIRE(t.find(XferTable<Entry>::kFree) == t.end());
  t.erase(2);
  t.erase(9);  // unknown: nothing
  t.erase(2);  // twice: nothing
  REQUIRE(t.size() == 3);
  REQUIRE(t.find(2) == t.end());
  auto ids = [&] {
    std::vector<int64_t> out;
    for (const auto& [id, e] : t) out.push_back(id);
    return out;
  };
  REQUIRE(ids() == std::vector<int64_t>{1, 3, 4});
  t.add(5).peer = 50;  // into 2's slot
  REQUIRE(ids() == std::vector<int64_t>{1, 5, 3, 4});
  REQUIRE(t.find(5)->second.peer == 50);
  t.erase(1), t.erase(3), t.erase(4), t.erase(5);
  REQUIRE(t.empty());
  REQUIRE(ids().empty());
}

TEST_CASE("a released entry's buffer serves the next add, cleared", "[xfer_table]") {
  XferTable<Entry> t;
  Entry& a = t.add(1);
  a.peer = 7;
  a.buffer.assign(1000, 5);
  const int* storage = a.buffer.data();
  t.erase(1);
  Entry& b = t.add(2);
  REQUIRE(b.peer == 0);
  REQUIRE(b.buffer.empty());
  REQUIRE(b.buffer.capacity() >= 1000);
  b.buffer.push_back(1);
  REQUIRE(b.buffer.data() == storage);  // the same memory: no allocation
}
