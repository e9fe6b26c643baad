// UTF-8 helpers for the tokenizer: character iteration, validation, and the
// lossy conversion Hugging Face uses when decoded bytes are not valid UTF-8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::runtime {

// Length in bytes of the UTF-8 sequence that starts with lead byte c (1 for
// an invalid lead byte, so callers always make progress).
inline std::size_t utf8_char_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

// Appends code point cp as UTF-8.
void append_utf8(std::string& out, uint32_t cp);

// Decodes the code point at s[i] (valid UTF-8 assumed) and advances i.
uint32_t next_code_point(std::string_view s, std::size_t& i);

// Length of the longest valid UTF-8 sequence starting at s[i] (0 when s[i]
// starts no valid sequence; a truncated but so-far-valid sequence also gives 0).
std::size_t valid_utf8_prefix_len(std::string_view s, std::size_t i);

bool is_valid_utf8(std::string_view s);

// Replaces every maximal invalid subsequence with U+FFFD, exactly as Rust's
// String::from_utf8_lossy does (the WHATWG "maximal subpart" rule).
std::string utf8_lossy(std::string_view bytes);

// s without the leading (left) and trailing (right) code points for which
// strip(cp) is true. s must be valid UTF-8.
std::string_view trim_code_points(std::string_view s, bool left, bool right, bool (*strip)(uint32_t));

// True when s ends inside a multi-byte sequence that more bytes could complete.
bool ends_with_incomplete_utf8(std::string_view s);

}  // namespace tandem::runtime
