// A job's per-file defaults ([defaults] in the job file, or --defaults
// FILE.json): request fields merged under every batch line's body, so a
// million-line file need not repeat one system prompt, schema or sampling
// setting on every line (docs/run.md, "Defaults for every line").
//
// Merging: a field the line gives wins (null included: it removes the
// default); a default the line lacks is added; "messages" is the exception:
// the defaults' messages go before the line's (a shared system prompt, or
// few-shot examples). Every line is then checked as it always is, so a
// default its endpoint does not take makes that line an error record that
// says so.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tandem::router {

// What a line's error says when the defaults, not the line, caused it.
inline constexpr const char* kDefaultsHint =
    " (a field of the job's defaults, [defaults] or --defaults: the line alone is valid)";

struct BodyDefaults {
  nlohmann::json body = nlohmann::json::object();
  nlohmann::ordered_json ordered = nlohmann::ordered_json::object();  // as written (structured outputs keep key order)

  bool empty() const { return body.empty(); }
  // From JSON text (an object). Throws tandem::Error with one line, `source`
  // naming where it came from, when it is not an object, holds a field a
  // default cannot be (custom_id, url, method, body, prompt,
  // prompt_token_ids), or would make both a chat and a completions line invalid.
  static BodyDefaults parse(const std::string& text, const std::string& source);
  // `line_body` with the defaults merged under it.
  nlohmann::json merged(const nlohmann::json& line_body) const;
  nlohmann::ordered_json merged(const nlohmann::ordered_json& line_body) const;
  // A canonical text of the defaults (sorted keys): what a resumed run must match.
  std::string canonical() const { return body.dump(); }
};

}  // namespace tandem::router
