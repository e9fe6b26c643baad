#include "router/line_key.h"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "router/json_sax.h"

namespace tandem::router {
namespace {

// Stops the parse at the first top-level key "custom_id"'s value (or at the
// line's first error), taking the value when it is a string.
struct FirstCustomId : JsonSaxBase {
  int depth = 0;
  bool at_id = false;
  std::string id;

  bool on_value() override { return !at_id; }  // any other value of custom_id ends the search with ""
  bool string(string_t& s) override {
    if (!at_id) return true;
    id = std::move(s);
    return false;
  }
  bool start_object(std::size_t) override { return on_value() && (++depth, true); }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return on_value() && (++depth, true); }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    at_id = depth == 1 && k == "custom_id";
    return true;
  }
};

}  // namespace

std::string line_key_id(std::string_view text) {
  FirstCustomId sax;
  nlohmann::json::sax_parse(text, &sax, nlohmann::json::input_format_t::json, /*strict=*/false);
  return std::move(sax.id);
}

uint64_t line_text_hash(std::string_view text, uint64_t length) {
  return XXH3_64bits_withSeed(text.data(), text.size(), length);
}

bool blank_line(std::string_view text, bool too_long) {
  return !too_long && text.find_first_not_of(" \t\r") == std::string_view::npos;
}

}  // namespace tandem::router
