// Code points as UTF-8 bytes: a matcher reads bytes, a character class names
// code points, so each class becomes the byte sequences of its ranges.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::grammar {

using CodeRange = std::pair<uint32_t, uint32_t>;  // inclusive
using ByteRange = std::pair<uint8_t, uint8_t>;    // inclusive

std::size_t utf8_length(unsigned char lead);  // 0: not a lead byte
uint32_t utf8_decode(std::string_view one_char);
std::string utf8_encode(uint32_t cp);

// Sorted, merged, surrogates (U+D800-DFFF) removed; the complement within
// U+0000-10FFFF when `negated`.
std::vector<CodeRange> normalize_ranges(std::vector<CodeRange> ranges, bool negated);

// The byte sequences that spell exactly the code points of [lo, hi]: each
// sequence is 1-4 byte ranges, one per byte (as RE2 and utf8-ranges split them).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<ByteRange>>& out);

}  // namespace tandem::grammar
