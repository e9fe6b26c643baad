// Small text helpers shared by error messages ("did you mean ...").
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// Levenshtein distance (insert, delete, substitute: cost 1 each).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to word, if it is close enough to be a likely typo
// (distance at most a third of the word's length, at least 1; ties go to the first).
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);

}  // namespace tandem
