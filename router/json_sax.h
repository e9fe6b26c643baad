// A SAX reader for nlohmann's parser that reads on through every event and
// ignores it: a subclass overrides what it looks for (the first custom_id of
// a line, router/line_key.cpp; where a line stops being JSON,
// router/batch_request.cpp).
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace tandem::router {

struct JsonSaxBase : nlohmann::json_sax<nlohmann::json> {
  // Every scalar value (strings too, unless string() is overridden); false stops the parse.
  virtual bool on_value() { return true; }
  bool null() override { return on_value(); }
  bool boolean(bool) override { return on_value(); }
  bool number_integer(number_integer_t) override { return on_value(); }
  bool number_unsigned(number_unsigned_t) override { return on_value(); }
  bool number_float(number_float_t, const string_t&) override { return on_value(); }
  bool binary(binary_t&) override { return on_value(); }
  bool string(string_t&) override { return on_value(); }
  bool start_object(std::size_t) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool key(string_t&) override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

}  // namespace tandem::router
