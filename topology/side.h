// Which side of a disaggregated job a worker is on: it prefills, or it
// decodes (aggregated: it does both, and is on the decode side). Named, never
// a bool: `groups(Side::kPrefill)` says what `groups(true)` hid.
#pragma once

#include <array>
#include <string_view>

namespace tandem::topology {

enum class Side { kPrefill, kDecode };
inline constexpr std::array<Side, 2> kSides{Side::kPrefill, Side::kDecode};

constexpr Side other(Side s) { return s == Side::kPrefill ? Side::kDecode : Side::kPrefill; }
constexpr std::string_view side_name(Side s) { return s == Side::kPrefill ? "prefill" : "decode"; }

// One value for each side, reached by name: no array whose order must be remembered.
template <class T>
struct BySide {
  T prefill{}, decode{};
  T& operator[](Side s) { return s == Side::kPrefill ? prefill : decode; }
  const T& operator[](Side s) const { return s == Side::kPrefill ? prefill : decode; }
  bool operator==(const BySide&) const = default;
};

}  // namespace tandem::topology
