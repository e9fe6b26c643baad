#include "router/body_defaults.h"

#include <variant>

#include "common/error.h"
#include "router/batch_request.h"

namespace tandem::router {

using json = nlohmann::json;


namespace {

template <class Json>
Json merge_under(const Json& defaults, const Json& line) {
  Json out = line;
  for (auto it = defaults.begin(); it != defaults.end(); ++it) {
    if (it.key() == "messages" && line.contains("messages") && line["messages"].is_array() && it.value().is_array()) {
      Json all = it.value();
      for (const auto& m : line["messages"]) all.push_back(m);
      out["messages"] = std::move(all);
    } else if (!line.contains(it.key())) {
      out[it.key()] = it.value();
    }
  }
  return out;
}

}  // namespace

json BodyDefaults::merged(const json& line_body) const {
  return line_body.is_object() ? merge_under(body, line_body) : line_body;
}

nlohmann::ordered_json BodyDefaults::merged(const nlohmann::ordered_json& line_body) const {
  return line_body.is_object() ? merge_under(ordered, line_body) : line_body;
}

BodyDefaults BodyDefaults::parse(const std::string& text, const std::string& source) {
  BodyDefaults d;
  try {
    d.ordered = nlohmann::ordered_json::parse(text);
    d.body = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(source + ": not valid JSON (" + e.what() + "); the defaults are one JSON object of request fields");
  }
  if (!d.body.is_object())
    throw Error(source + ": the defaults must be an object of request fields, got " + (d.body.is_array() ? "an array" : std::string("a ") + d.body.type_name()));
  for (const char* key : {"custom_id", "url", "method", "body", "prompt", "prompt_token_ids"})
    if (d.body.contains(key))
      throw Error(source + ": '" + key + "' cannot be a default (each line gives its own" +
                  (std::string(key) == "body" ? "; write the body's fields themselves" : "") + ")");
  // Checked as lines would be: it must suit chat or completions lines (a field of one only is fine).
  std::string why;
  for (const char* sample : {R"({"custom_id":"defaults","url":"/v1/chat/completions","method":"POST","body":{"messages":[{"role":"user","content":"x"}]}})",
                             R"({"custom_id":"defaults","url":"/v1/completions","method":"POST","body":{"prompt":"x"}})"}) {
    const ParsedLine p = parse_batch_line(sample, 16, &d);
    if (std::holds_alternative<BatchRequest>(p)) return d;
    if (why.empty()) why = std::get<LineError>(p).message;
  }
  if (const auto hint = why.find(kDefaultsHint); hint != std::string::npos) why.erase(hint);  // it is the defaults
  throw Error(source + ": " + why);
}

}  // namespace tandem::router
