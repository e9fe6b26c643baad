#include "runtime/tokenizer/pieces.h"

#include <tuple>

namespace tandem::runtime {

void split_piece(const Piece& piece, const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Piece>& out) {
  const std::string_view s = piece.text;
  // Parts as (begin, end, is_match), covering s.
  std::vector<std::tuple<std::size_t, std::size_t, bool>> parts;
  std::size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) parts.emplace_back(prev, b, invert);
    parts.emplace_back(b, e, !invert);
    prev = e;
  }
  if (prev < s.size()) parts.emplace_back(prev, s.size(), invert);

  std::vector<std::pair<std::size_t, std::size_t>> cut;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto [b, e, m] : parts) cut.emplace_back(b, e);
      break;
    case SplitBehavior::kRemoved:
      for (auto [b, e, m] : parts)
        if (!m) cut.emplace_back(b, e);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (auto [b, e, m] : parts) {
        if (m && !cut.empty() && !prev_match) cut.back().second = e;
        else cut.emplace_back(b, e);
        prev_match = m;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (auto [b, e, m] : parts) {
        if (!m && prev_match && !cut.empty()) cut.back().second = e;
        else cut.emplace_back(b, e);
        prev_match = m;
      }
      break;
    }
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (auto [b, e, m] : parts) {
        if (m && prev_match && !cut.empty()) cut.back().second = e;
        else cut.emplace_back(b, e);
        prev_match = m;
      }
      break;
    }
  }
  for (auto [b, e] : cut)
    if (e > b) out.push_back(Piece{s.substr(b, e - b), piece.at_input_start && b == 0});
}

}  // namespace tandem::runtime
