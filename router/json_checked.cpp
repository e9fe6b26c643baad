#include "router/json_checked.h"

#include <algorithm>
#include <unordered_set>
#include <vector>

#include "router/json_sax.h"

namespace tandem::router {

using json = nlohmann::json;

namespace {

// Where a line that is not valid JSON breaks, and why (its custom_id, as
// far as it was read, is line_key_id's: the error record carries it, as a
// user matching errors to requests needs).
struct Salvage : JsonSaxBase {
  std::size_t at = 0;
  std::string why;

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    at = position;
    // nlohmann's text from "column" ("... parse error at line 1, column 9: syntax error ...": the line is one
    // line), else after its "[json.exception...] " tag ("number overflow parsing '1e400'").
    const std::string what = e.what();
    const auto column = what.find("column "), tag = what.find("] ");
    why = column != std::string::npos ? what.substr(column)
          : tag != std::string::npos  ? "byte " + std::to_string(position) + " (" + what.substr(tag + 2) + ")"
                                      : std::string();
    return false;
  }
};

// The keys of one JSON object as parsed, to find one given twice (a short
// list while small, a set past that, so a huge object stays linear).
class KeySet {
 public:
  bool insert(const std::string& k) {
    if (big_.empty()) {
      if (std::find(small_.begin(), small_.end(), k) != small_.end()) return false;
      small_.push_back(k);
      if (small_.size() > 32) big_.insert(small_.begin(), small_.end());
      return true;
    }
    return big_.insert(k).second;
  }

 private:
  std::vector<std::string> small_;
  std::unordered_set<std::string> big_;
};

// Parses like json::parse (discarded when invalid), and names the first key
// that an object holds twice: JSON allows it and the parser keeps the last,
// but which one the writer meant is unknown (a prompt given twice, two
// custom_ids), so such a line is refused.
}  // namespace

json parse_checked(std::string_view text, std::string& duplicate) {
  std::vector<KeySet> open;
  const json::parser_callback_t cb = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open.emplace_back();
    else if (event == json::parse_event_t::object_end && !open.empty()) open.pop_back();
    else if (event == json::parse_event_t::key && !open.empty() && !open.back().insert(parsed.get_ref<const std::string&>()) &&
             duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  return json::parse(text, cb, /*allow_exceptions=*/false);
}

std::string duplicate_message(const std::string& key) {
  return "the key '" + key + "' is given twice in one object; give each field once";
}

std::string where_json_breaks(std::string_view text) {
  Salvage s;
  json::sax_parse(text, &s, json::input_format_t::json, /*strict=*/true);
  return !s.why.empty() ? " at " + s.why : s.at > 0 ? " at byte " + std::to_string(s.at) : "";
}

}  // namespace tandem::router
