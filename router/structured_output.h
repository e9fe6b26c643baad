// A request's structured output, as the EBNF the workers constrain it to:
//   response_format {"type": "json_object"} | {"type": "json_schema",
//     "json_schema": {"name", "schema", "strict", "description"}} (OpenAI);
//   structured_outputs {"json" | "regex" | "choice" | "grammar" |
//     "json_object"} (vLLM), and vLLM's older guided_json, guided_regex,
//     guided_choice, guided_grammar.
// Checked here, on rank 0, so a bad schema is that line's error record and
// never reaches a worker; converted and compiled once per distinct text (a
// batch file repeats one schema on every line). docs/structured-outputs.md
// is the user's page.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace tandem::router {

// Which structured-output fields a body may hold (check_fields honours them).
bool is_structured_output_field(const std::string& key);

// The EBNF for the body's structured output, "" when it asks for none (or
// for {"type": "text"}). `ordered` gives the body parsed with its key order
// kept (a schema's properties come out in the order written); it is called
// only when the body has such a field. Throws tandem::Error with one line
// naming the field: two structured outputs at once, an unsupported keyword,
// a schema or grammar that does not compile.
std::string structured_output_ebnf(const nlohmann::json& body, const std::function<nlohmann::ordered_json()>& ordered);

// convert()'s EBNF once it compiles, remembered by key (process-wide, bounded)
// with the error it gave: a batch file repeats one schema, or one set of
// tools, on every line. Throws tandem::Error "'field': why".
std::string checked_ebnf(const std::string& field, const std::string& key, const std::function<std::string()>& convert);

}  // namespace tandem::router
