#include <catch2/catch.hpp>

#include "runtime/tokenizer/byte_level.h"
#include "runtime/tokenizer/utf8.h"

using namespace tandem::runtime;

TEST_CASE("utf8_lossy replaces maximal invalid subparts like Rust's from_utf8_lossy", "[tokenizer][utf8]") {
  const std::string r = "\xEF\xBF\xBD";
  CHECK(utf8_lossy("plain") == "plain");
  CHECK(utf8_lossy("\xE4\xBD\xA0") == "\xE4\xBD\xA0");          // 你
  CHECK(utf8_lossy("\xE4\xBD") == r);                          // truncated: one replacement
  CHECK(utf8_lossy("a\xFF" "b") == "a" + r + "b");
  CHECK(utf8_lossy("\xF0\x9F\x98") == r);                      // 3 of 4 bytes of an emoji
  CHECK(utf8_lossy("\xE0\x80\x80") == r + r + r);              // overlong: each byte on its own
  CHECK(utf8_lossy("\xED\xA0\x80") == r + r + r);              // surrogate
  CHECK(utf8_lossy("\xC3\x28") == r + "(");
}

TEST_CASE("ends_with_incomplete_utf8 spots a character cut short", "[tokenizer][utf8]") {
  CHECK(ends_with_incomplete_utf8("ab\xE4\xBD"));
  CHECK(ends_with_incomplete_utf8("\xF0\x9F"));
  CHECK_FALSE(ends_with_incomplete_utf8("ab\xE4\xBD\xA0"));
  CHECK_FALSE(ends_with_incomplete_utf8("ab"));
  CHECK_FALSE(ends_with_incomplete_utf8("a\xFF"));
  CHECK_FALSE(ends_with_incomplete_utf8(""));
}

TEST_CASE("the byte-level alphabet maps every byte and back", "[tokenizer][utf8]") {
  CHECK(bytes_to_byte_level(" ") == "\xC4\xA0");  // Ġ
  CHECK(bytes_to_byte_level("\n") == "\xC4\x8A");  // Ċ
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  CHECK(byte_level_to_bytes(bytes_to_byte_level(all)) == all);
  CHECK_FALSE(byte_level_to_bytes("\xE4\xBD\xA0").has_value());  // 你 is not in the alphabet
}
