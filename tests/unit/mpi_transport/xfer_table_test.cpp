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

TEST_CASE("the transfer table finds, forgets and keeps the order of its entries", "[xfer_table]") {
  XferTable<Entry> t;
  for (int64_t id = 1; id <= 4; ++id) t.add(id).peer = static_cast<int>(id * 10);
  REQUIRE(t.size() == 4);
  REQUIRE(t.find(3)->second.peer == 30);
  REQUIRE(t.find(9) == t.end());
  t.erase(2);
  t.erase(9);  // unknown: nothing
  std::vector<int64_t> ids;
  for (const auto& [id, e] : t) ids.push_back(id);
  REQUIRE(ids == std::vector<int64_t>{1, 3, 4});
  t.erase(1), t.erase(3), t.erase(4);
  REQUIRE(t.empty());
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
