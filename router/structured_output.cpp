#include "router/structured_output.h"

#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace tandem::router {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const char* const kFields[] = {"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                               "guided_grammar"};

// What one field asks for, before conversion: (kind, text), kind one of
// json_schema (text: the schema), json_object, regex, choice (text: the JSON list), grammar.
struct Ask {
  std::string field;
  std::string kind;
  std::string text;
};

std::string type_of(const ojson& v) { return v.type_name(); }

ojson schema_value(const ojson& v, const std::string& where) {
  if (v.is_string()) {  // vLLM takes a schema given as a JSON string too
    try {
      return ojson::parse(v.get<std::string>());
    } catch (const ojson::exception&) {
      throw Error("'" + where + "' holds a string that is not JSON; give the schema as an object");
    }
  }
  if (!v.is_object() && !v.is_boolean()) throw Error("'" + where + "' must be a JSON schema (an object), got " + type_of(v));
  return v;
}

std::optional<Ask> response_format(const ojson& v) {
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string()) {
    throw Error("'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
  }
  const std::string type = v["type"].get<std::string>();
  for (const auto& [k, x] : v.items()) {
    if (k != "type" && !(type == "json_schema" && k == "json_schema")) {
      throw Error("'response_format." + k + "' is not a field of a " + type + " response_format; remove it");
    }
  }
  if (type == "text") return std::nullopt;
  if (type == "json_object") return Ask{"response_format", "json_object", ""};
  if (type != "json_schema") {
    throw Error("'response_format.type' " + json(type).dump() + " is not supported; use text, json_object or json_schema");
  }
  if (!v.contains("json_schema") || !v["json_schema"].is_object()) {
    throw Error("'response_format' of type json_schema needs 'json_schema': {\"name\", \"schema\"}");
  }
  const ojson& js = v["json_schema"];
  for (const auto& [k, x] : js.items()) {
    if (k == "name" || k == "description" || k == "schema") continue;
    if (k == "strict") {
      if (!x.is_boolean() && !x.is_null()) throw Error("'response_format.json_schema.strict' must be true or false");
      continue;  // the grammar is exact either way
    }
    throw Error("'response_format.json_schema." + k + "' is not supported; it has name, description, schema and strict");
  }
  if (!js.contains("schema")) {
    throw Error("'response_format.json_schema.schema' is missing; give the JSON schema the output must follow");
  }
  return Ask{"response_format", "json_schema", schema_value(js["schema"], "response_format.json_schema.schema").dump()};
}

// `legacy`: the guided_* field it came from (its one key is named so in errors).
Ask structured_outputs(const ojson& v, const std::string& legacy = "") {
  if (!v.is_object()) throw Error("'structured_outputs' must be an object such as {\"json\": {...schema...}}");
  std::vector<Ask> asks;
  for (const auto& [k, x] : v.items()) {
    const std::string where = legacy.empty() ? "structured_outputs." + k : legacy;
    if (x.is_null()) continue;
    if (k == "json") {
      asks.push_back({where, "json_schema", schema_value(x, where).dump()});
    } else if (k == "json_object") {
      if (x != true) throw Error("'" + where + "' must be true when given");
      asks.push_back({where, "json_object", ""});
    } else if (k == "regex" || k == "grammar") {
      if (!x.is_string()) throw Error("'" + where + "' must be a string");
      asks.push_back({where, k, x.get<std::string>()});
    } else if (k == "choice") {
      if (!x.is_array() || x.empty()) throw Error("'" + where + "' must be a non-empty array of strings");
      for (const auto& c : x) {
        if (!c.is_string()) throw Error("'" + where + "' must hold strings only");
      }
      asks.push_back({where, "choice", x.dump()});
    } else if (k == "disable_any_whitespace" && x == true) {
      continue;  // what Tandem always does
    } else if (k == "disable_additional_properties" && x == true) {
      continue;  // Tandem's default: a schema without additionalProperties allows none
    } else if (k == "disable_fallback") {
      continue;  // one engine, nothing to fall back to
    } else {
      throw Error("'" + where + "' is not supported (whitespace is always compact, and a schema without "
                  "additionalProperties allows none); Tandem reads json, regex, choice, grammar and json_object");
    }
  }
  if (asks.empty()) throw Error("'structured_outputs' asks for nothing; give one of json, regex, choice, grammar, json_object");
  if (asks.size() > 1) {
    throw Error("'" + asks[0].field + "' and '" + asks[1].field + "' both constrain the output; give one");
  }
  return asks[0];
}

std::string to_ebnf(const Ask& a) {
  if (a.kind == "json_object") return grammar::json_object_ebnf();
  if (a.kind == "json_schema") return grammar::json_schema_to_ebnf(ojson::parse(a.text));
  if (a.kind == "regex") return "root ::= " + grammar::regex_to_ebnf(a.text, grammar::RegexContext::kText) + "\n";
  if (a.kind == "choice") {
    std::string out = "root ::= ";
    bool first = true;
    for (const auto& c : ojson::parse(a.text)) {
      const std::string s = c.get<std::string>();
      if (s.empty()) throw Error("an empty string cannot be a choice");
      out += (first ? "" : " | ") + grammar::ebnf_literal(s);
      first = false;
    }
    return out + "\n";
  }
  return a.text;  // grammar
}

// Conversions and compile checks by key, bounded: a result or the error it gave.
class Checked {
 public:
  std::string ebnf(const std::string& field, const std::string& key, const std::function<std::string()>& convert) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (const auto it = map_.find(key); it != map_.end()) {
        if (!it->second.second) throw Error("'" + field + "': " + it->second.first);
        return it->second.first;
      }
    }
    std::pair<std::string, bool> result;
    try {
      std::string text = convert();
      grammar::Grammar::from_ebnf(text);
      result = {std::move(text), true};
    } catch (const Error& e) {
      result = {e.what(), false};
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= 256) map_.clear();
    map_.emplace(key, result);
    if (!result.second) throw Error("'" + field + "': " + result.first);
    return result.first;
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::pair<std::string, bool>> map_;
};

}  // namespace

bool is_structured_output_field(const std::string& key) {
  for (const char* f : kFields) {
    if (key == f) return true;
  }
  return false;
}

std::string structured_output_ebnf(const json& body, const std::function<ojson()>& ordered) {
  bool any = false;
  for (const char* f : kFields) any |= body.contains(f) && !body[f].is_null();
  if (!any) return "";
  const ojson b = ordered();
  std::vector<Ask> asks;
  if (b.contains("response_format") && !b["response_format"].is_null()) {
    if (auto a = response_format(b["response_format"])) asks.push_back(*a);
  }
  if (b.contains("structured_outputs") && !b["structured_outputs"].is_null()) {
    asks.push_back(structured_outputs(b["structured_outputs"]));
  }
  for (const char* legacy : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (!b.contains(legacy) || b[legacy].is_null()) continue;
    const std::string k = std::string(legacy).substr(7);  // json, regex, choice, grammar
    ojson one = ojson::object();
    one[k] = b[legacy];
    asks.push_back(structured_outputs(one, legacy));
  }
  if (asks.empty()) return "";
  if (asks.size() > 1) throw Error("'" + asks[0].field + "' and '" + asks[1].field + "' both constrain the output; give one");
  const Ask& a = asks[0];
  return checked_ebnf(a.field, a.kind + '\n' + a.text, [&] { return to_ebnf(a); });
}

std::string checked_ebnf(const std::string& field, const std::string& key, const std::function<std::string()>& convert) {
  static Checked checked;
  return checked.ebnf(field, key, convert);
}

}  // namespace tandem::router
