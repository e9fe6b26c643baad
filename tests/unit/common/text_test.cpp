#include <catch2/catch.hpp>

#include "common/text.h"

using tandem::closest_match;
using tandem::edit_distance;

TEST_CASE("edit_distance counts inserts, deletes and substitutions", "[common]") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("block_size", "block_size") == 0);
  CHECK(edit_distance("blok_size", "block_size") == 1);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("", "abc") == 3);
}

TEST_CASE("closest_match suggests near misses only", "[common]") {
  const std::vector<std::string> keys = {"block_size", "memory_gib", "store_path"};
  CHECK(closest_match("blok_size", keys) == "block_size");
  CHECK(closest_match("memory_gb", keys) == "memory_gib");
  CHECK_FALSE(closest_match("threads", keys).has_value());
  CHECK_FALSE(closest_match("x", keys).has_value());
}
