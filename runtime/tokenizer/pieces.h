// The text of one encode call as it moves through pre-tokenization: a list of
// pieces, each a view into the input or into strings the pipeline made
// (Metaspace replacing spaces, a prefix space). Views stay valid for the
// Pieces' lifetime: `storage` is a deque, which never moves its elements.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::runtime {

struct Piece {
  std::string_view text;
  bool at_input_start = false;  // begins at offset 0 of the original input
};

struct Pieces {
  std::vector<Piece> list;
  std::deque<std::string> storage;

  std::string_view keep(std::string s) {
    storage.push_back(std::move(s));
    return storage.back();
  }
};

// How a piece is cut around pattern matches (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Cuts `piece` at the matches [begin, end) (sorted, non-overlapping) and appends
// the non-empty parts to out. invert: the gaps between matches are the delimiters.
void split_piece(const Piece& piece, const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Piece>& out);

}  // namespace tandem::runtime
