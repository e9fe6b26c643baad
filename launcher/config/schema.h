// The config schema: every key Tandem accepts, its type, bounds, default and
// documentation, bound to its field in Config. It is the single source for
// loading and validation (load.cpp), the effective-config dump, and the
// reference in docs/config.md (`tandem config --reference`).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "launcher/config/config.h"

namespace tandem::launcher {

using Value = std::variant<bool, int64_t, double, std::string>;
enum class ValueKind { kBool, kInt, kFloat, kString };

struct KeySpec {
  std::string section;
  std::string name;
  ValueKind kind = ValueKind::kString;
  std::string doc;
  std::vector<std::string> choices;  // strings: the allowed values; empty: any string
  std::optional<double> min;         // numbers: inclusive lower bound
  std::optional<double> max;         // numbers: inclusive upper bound
  // Strings with inner structure (planner.policy): "" when valid, else why not.
  std::function<std::string(std::string_view)> check;
  // Empty when the key acts today; otherwise the feature that will act on it.
  // Such keys are validated already so that job files written now keep working.
  std::string pending;
  std::function<void(Config&, const Value&)> set;
  std::function<Value(const Config&)> get;

  std::string full_name() const { return section + "." + name; }
};

// Every key, grouped by section in the order of config.h.
const std::vector<KeySpec>& schema();
// Section names in schema order.
const std::vector<std::string>& section_names();
// Key names of one section.
std::vector<std::string> key_names(std::string_view section);
const KeySpec* find_key(std::string_view section, std::string_view name);

std::string_view kind_name(ValueKind kind);  // "an integer", "a string", ...
// A value as a TOML literal: 16, 0.5, true, "disagg".
std::string format_value(const Value& value);
// "" when value satisfies spec's bounds, choices and check; else the reason,
// phrased to follow "<section>.<key> ".
std::string check_value(const KeySpec& spec, const Value& value);

}  // namespace tandem::launcher
