#include "router/line_key.h"

#include <nlohmann/json.hpp>
#include <xxhash.h>

namespace tandem::router {
namespace {

// Stops the parse at the first top-level key "custom_id"'s value (or at the
// line's first error), taking the value when it is a string.
struct FirstCustomId : nlohmann::json_sax<nlohmann::json> {
  int depth = 0;
  bool at_id = false;
  std::string id;

  bool value() { return !at_id; }  // any other value of custom_id ends the search with ""
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool string(string_t& s) override {
    if (!at_id) return true;
    id = std::move(s);
    return false;
  }
  bool start_object(std::size_t) override { return value() && (++depth, true); }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return value() && (++depth, true); }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    at_id = depth == 1 && k == "custom_id";
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
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
