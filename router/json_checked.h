// The JSON-level checks of an input line or request body, before its fields
// are read: where a text that is not valid JSON breaks, and an object that
// gives one key twice (JSON allows it, the parser keeps the last, but which
// one the writer meant is unknown, so such a line is refused).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tandem::router {

// Parses like json::parse (discarded when invalid); `duplicate` gets the first key an object holds twice.
nlohmann::json parse_checked(std::string_view text, std::string& duplicate);
// " at line 1, column 9: ..." / " at byte N": where text stops being JSON ("" when unknown).
std::string where_json_breaks(std::string_view text);
std::string duplicate_message(const std::string& key);

}  // namespace tandem::router
