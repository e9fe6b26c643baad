#include "grammar/json_schema.h"

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "common/error.h"
#include "grammar/ebnf.h"
#include "grammar/regex.h"

namespace tandem::grammar {

namespace {

using Json = nlohmann::ordered_json;

const char* const kBasics = R"(json_char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json_string ::= "\"" json_char* "\""
json_integer ::= "0" | "-"? [1-9] [0-9]*
json_number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
json_value ::= json_object | json_array | json_string | json_number | "true" | "false" | "null"
json_object ::= "{" (json_string ":" json_value ("," json_string ":" json_value)*)? "}"
json_array ::= "[" (json_value ("," json_value)*)? "]"
)";

const std::set<std::string>& annotations() {
  static const std::set<std::string> k{"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                       "deprecated", "readOnly", "writeOnly", "$anchor", "contentMediaType",
                                       "contentEncoding"};
  return k;
}

const std::set<std::string>& supported() {
  static const std::set<std::string> k{"type", "properties", "required", "additionalProperties", "items", "prefixItems",
                                       "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                                       "$defs", "definitions", "minLength", "maxLength", "pattern", "format",
                                       "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  return k;
}

std::string pointer_escape(const std::string& key) {
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

// ---- integer ranges as digit patterns (the classic regex construction) ----

std::string digit_class(char lo, char hi) {
  if (lo == hi) return std::string("\"") + lo + "\"";
  return std::string("[") + lo + "-" + hi + "]";
}

// Digit strings of one length n, from lo to hi (leading zeros allowed).
void same_length(const std::string& lo, const std::string& hi, std::vector<std::string>& out, const std::string& prefix) {
  const std::size_t n = lo.size();
  if (n == 0) {
    out.push_back(prefix.empty() ? "\"\"" : prefix);
    return;
  }
  const auto join = [](const std::string& a, const std::string& b) { return a.empty() ? b : a + " " + b; };
  if (lo[0] == hi[0]) {
    same_length(lo.substr(1), hi.substr(1), out, join(prefix, digit_class(lo[0], lo[0])));
    return;
  }
  const std::string zeros(n - 1, '0'), nines(n - 1, '9');
  const std::string any = n > 1 ? "[0-9]{" + std::to_string(n - 1) + "}" : "";
  char mid_lo = lo[0], mid_hi = hi[0];
  if (lo.substr(1) != zeros) {
    same_length(lo.substr(1), nines, out, join(prefix, digit_class(lo[0], lo[0])));
    ++mid_lo;
  }
  const bool hi_full = hi.substr(1) == nines;
  if (!hi_full) --mid_hi;
  if (mid_lo <= mid_hi) out.push_back(join(join(prefix, digit_class(mid_lo, mid_hi)), any));
  if (!hi_full) same_length(zeros, hi.substr(1), out, join(prefix, digit_class(hi[0], hi[0])));
}

int64_t pow10(std::size_t d) {
  int64_t p = 1;
  for (std::size_t k = 0; k < d; ++k) p *= 10;
  return p;
}

// Non-negative integers in [lo, hi] (hi < 0: unbounded), written without leading zeros.
void non_negative(int64_t lo, int64_t hi, std::vector<std::string>& out) {
  const std::size_t dlo = std::to_string(lo).size();
  const std::size_t dmax = hi < 0 ? 19 : std::to_string(hi).size();
  for (std::size_t d = dlo; d <= dmax; ++d) {
    const int64_t first = d == 1 ? 0 : pow10(d - 1);
    const int64_t last = d >= 19 ? INT64_MAX : pow10(d) - 1;
    const int64_t a = std::max(lo, first);
    if (hi < 0 && a == first && d > 1) {  // every longer number: one pattern
      out.push_back("[1-9] [0-9]{" + std::to_string(d - 1) + ",}");
      return;
    }
    const int64_t b = hi < 0 ? last : std::min(hi, last);
    if (a > b) continue;
    same_length(std::to_string(a), std::to_string(b), out, "");
  }
}

std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> alts;
  // negatives: -[max(1,-hi), -lo]
  if (!lo || *lo < 0) {
    const int64_t nlo = (hi && *hi < 0) ? -*hi : 1;
    const int64_t nhi = lo ? -*lo : -1;
    std::vector<std::string> neg;
    non_negative(nlo, nhi, neg);
    for (auto& n : neg) alts.push_back("\"-\" " + n);
  }
  if (!hi || *hi >= 0) {
    non_negative(lo && *lo > 0 ? *lo : 0, hi ? *hi : -1, alts);
  }
  std::string out = "(";
  for (std::size_t k = 0; k < alts.size(); ++k) out += (k ? " | " : "") + ("(" + alts[k] + ")");
  return out + ")";
}

// ---- the converter ----

class Converter {
 public:
  // prefix: put before every rule name but the root's ("" for a grammar of its own).
  Converter(const Json& root, const JsonSchemaLimits& limits, std::string prefix = "")
      : root_(root), limits_(limits), prefix_(std::move(prefix)) {}

  // The rules, the first named `name`; no json_* rules (kBasics).
  std::string rules(const std::string& name) {
    const std::string root = value(root_, "", 0);
    std::string out = name + " ::= " + root + "\n";
    for (const auto& [rule, body] : rules_) out += rule + " ::= " + body + "\n";
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& what, const std::string& fix) const {
    throw Error("JSON schema at " + (path.empty() ? std::string("/") : path) + ": " + what + "; " + fix);
  }

  std::string new_rule(const std::string& hint) {
    if (rules_.size() >= limits_.max_rules) {
      fail("/", "more than " + std::to_string(limits_.max_rules) + " subschemas", "simplify the schema");
    }
    std::string base;
    for (const char c : hint) base += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
    if (base.empty() || !std::isalpha(static_cast<unsigned char>(base[0]))) base = "s_" + base;
    if (base.size() > 40) base.resize(40);
    const std::string name = prefix_ + base + "_" + std::to_string(rules_.size());
    rules_.emplace_back(name, "");
    return name;
  }
  void set_rule(const std::string& name, std::string body) {
    for (auto& r : rules_) {
      if (r.first == name) r.second = std::move(body);
    }
  }

  const Json& resolve(const std::string& ref, const std::string& path) const {
    if (ref == "#") return root_;
    if (ref.rfind("#/", 0) != 0) {
      fail(path, "'$ref' " + ref + " is not local", "only references into this schema (#, #/$defs/...) are supported");
    }
    const Json* at = &root_;
    std::size_t i = 2;
    while (i <= ref.size()) {
      std::size_t j = ref.find('/', i);
      if (j == std::string::npos) j = ref.size();
      std::string key;
      for (std::size_t k = i; k < j; ++k) {
        if (ref[k] == '~' && k + 1 < j) {
          key += ref[k + 1] == '1' ? '/' : '~';
          ++k;
        } else {
          key += ref[k];
        }
      }
      if (!at->is_object() || !at->contains(key)) fail(path, "'$ref' " + ref + " points nowhere", "define what it names");
      at = &(*at)[key];
      i = j + 1;
    }
    return *at;
  }

  void check_keywords(const Json& s, const std::string& path) const {
    for (const auto& [k, v] : s.items()) {
      if (supported().count(k) || annotations().count(k)) continue;
      fail(path, "'" + k + "' is not supported",
           "remove it or see docs/structured-outputs.md for the keywords Tandem enforces (none is ignored)");
    }
  }

  static bool only(const Json& s, std::initializer_list<const char*> keys) {
    for (const auto& [k, v] : s.items()) {
      if (annotations().count(k) || k == "$defs" || k == "definitions") continue;
      bool ok = false;
      for (const char* key : keys) ok |= k == key;
      if (!ok) return false;
    }
    return true;
  }

  std::string value(const Json& s, const std::string& path, int depth) {
    if (depth > limits_.max_depth) {
      fail(path, "subschemas nested deeper than " + std::to_string(limits_.max_depth), "flatten the schema with $defs");
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return "json_value";
      fail(path, "the schema 'false' matches nothing", "remove it");
    }
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean", "write {\"type\": ...}");
    check_keywords(s, path);
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) fail(path, "'$ref' must be a string", "write \"#/$defs/name\"");
      if (!only(s, {"$ref"})) fail(path, "'$ref' next to other keywords", "move them into the referenced schema");
      const std::string ref = s["$ref"].get<std::string>();
      if (const auto it = refs_.find(ref); it != refs_.end()) return it->second;
      const std::string name = new_rule("ref_" + ref.substr(ref.rfind('/') + 1));
      refs_[ref] = name;
      set_rule(name, value(resolve(ref, path), ref.substr(1), depth + 1));
      return name;
    }
    if (s.contains("const")) {
      if (!only(s, {"const", "type", "enum"})) fail(path, "'const' next to other constraints", "use 'const' alone");
      return ebnf_literal(s["const"].dump());
    }
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) fail(path, "'enum' must be a non-empty array", "list the values");
      if (!only(s, {"enum", "type"})) fail(path, "'enum' next to other constraints", "use 'enum' alone");
      std::string out = "(";
      bool first = true;
      for (const auto& v : s["enum"]) {
        out += (first ? "" : " | ") + ebnf_literal(v.dump());
        first = false;
      }
      return out + ")";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const Json& list = s[key];
      if (!list.is_array() || list.empty()) fail(path, std::string("'") + key + "' must be a non-empty array", "list the schemas");
      if (!only(s, {key})) fail(path, std::string("'") + key + "' next to other keywords", "move them into each branch");
      std::string out = "(";
      for (std::size_t k = 0; k < list.size(); ++k) {
        out += (k ? " | " : "") + value(list[k], path + "/" + key + "/" + std::to_string(k), depth + 1);
      }
      return out + ")";
    }
    if (s.contains("allOf")) return value(merge_all_of(s, path), path, depth + 1);

    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const auto& x : t) {
          if (!x.is_string()) fail(path, "'type' lists something that is not a string", "list type names");
          types.push_back(x.get<std::string>());
        }
      } else {
        fail(path, "'type' must be a name or a list of names", "e.g. \"string\" or [\"string\", \"null\"]");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) {
      types.push_back("integer");
    } else {
      return "json_value";
    }
    std::string out = types.size() > 1 ? "(" : "";
    for (std::size_t k = 0; k < types.size(); ++k) out += (k ? " | " : "") + typed(s, types[k], path, depth);
    return out + (types.size() > 1 ? ")" : "");
  }

  Json merge_all_of(const Json& s, const std::string& path) const {
    if (!s["allOf"].is_array()) fail(path, "'allOf' must be an array", "list the schemas");
    Json merged = Json::object();
    merged["type"] = "object";
    merged["properties"] = Json::object();
    merged["required"] = Json::array();
    std::optional<Json> additional;
    const auto fold = [&](const Json& part, const std::string& where) {
      const Json& p = (part.is_object() && part.contains("$ref")) ? resolve(part["$ref"].get<std::string>(), where) : part;
      if (!p.is_object() || !only(p, {"type", "properties", "required", "additionalProperties"}) ||
          (p.contains("type") && p["type"] != "object")) {
        fail(where, "'allOf' of anything but object schemas (type, properties, required, additionalProperties)",
             "merge the schemas by hand");
      }
      if (p.contains("properties")) {
        for (const auto& [k, v] : p["properties"].items()) {
          if (merged["properties"].contains(k)) fail(where, "property '" + k + "' in two 'allOf' branches", "define it once");
          merged["properties"][k] = v;
        }
      }
      if (p.contains("required")) {
        for (const auto& r : p["required"]) merged["required"].push_back(r);
      }
      if (p.contains("additionalProperties")) {
        if (additional && *additional != p["additionalProperties"]) {
          fail(where, "'allOf' branches disagree on additionalProperties", "state it once");
        }
        additional = p["additionalProperties"];
      }
    };
    for (std::size_t k = 0; k < s["allOf"].size(); ++k) fold(s["allOf"][k], path + "/allOf/" + std::to_string(k));
    Json rest = s;
    rest.erase("allOf");
    for (const auto& [k, v] : rest.items()) {
      if (!annotations().count(k) && k != "$defs" && k != "definitions") {
        fail(path, "'allOf' next to '" + k + "'", "move it into one of the branches");
      }
    }
    if (additional) merged["additionalProperties"] = *additional;
    return merged;
  }

  static std::optional<int64_t> get_int(const Json& s, const char* key, const std::string& path, const Converter& c) {
    if (!s.contains(key)) return std::nullopt;
    const Json& v = s[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>()))) {
      return static_cast<int64_t>(v.get<double>());
    }
    c.fail(path, std::string("'") + key + "' must be an integer here", "write a whole number");
  }

  std::string typed(const Json& s, const std::string& type, const std::string& path, int depth) {
    if (type == "null") return "\"null\"";
    if (type == "boolean") return "(\"true\" | \"false\")";
    if (type == "number") {
      for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (s.contains(k)) fail(path, std::string("'") + k + "' on a number", "bounds are enforced on integers only; use \"type\": \"integer\"");
      }
      return "json_number";
    }
    if (type == "integer") {
      std::optional<int64_t> lo = get_int(s, "minimum", path, *this), hi = get_int(s, "maximum", path, *this);
      if (const auto x = get_int(s, "exclusiveMinimum", path, *this)) lo = lo ? std::max(*lo, *x + 1) : *x + 1;
      if (const auto x = get_int(s, "exclusiveMaximum", path, *this)) hi = hi ? std::min(*hi, *x - 1) : *x - 1;
      if (!lo && !hi) return "json_integer";
      if (lo && hi && *lo > *hi) fail(path, "no integer lies within the bounds", "fix minimum/maximum");
      return integer_range(lo, hi);
    }
    if (type == "string") return string(s, path);
    if (type == "object") return object(s, path, depth);
    if (type == "array") return array(s, path, depth);
    fail(path, "unknown type '" + type + "'", "use string, number, integer, boolean, null, object or array");
  }

  std::string string(const Json& s, const std::string& path) {
    const auto lo = get_int(s, "minLength", path, *this), hi = get_int(s, "maxLength", path, *this);
    const bool lengths = lo || hi;
    if (s.contains("pattern") || s.contains("format")) {
      if (lengths) fail(path, "minLength/maxLength next to pattern or format", "put the length into the pattern, e.g. ^[a-z]{3,8}$");
      if (s.contains("pattern") && s.contains("format")) fail(path, "both 'pattern' and 'format'", "keep one");
      std::string re;
      if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) fail(path, "'pattern' must be a string", "write a regular expression");
        re = s["pattern"].get<std::string>();
      } else {
        const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
        // Calendar dates only (RFC 3339 full-date, as ajv-formats checks): each month's days, 29 February in
        // leap years (divisible by 4, centuries only by 400). Times without the leap second :60.
        static const std::string kDate =
            R"(([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))|)"
            R"(([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29))";
        static const std::string kTime = R"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))";
        if (f == "date") {
          re = kDate;
        } else if (f == "time") {
          re = kTime;
        } else if (f == "date-time") {
          re = kDate + "T" + kTime;
        } else if (f == "uuid") {
          re = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
        } else if (f == "email") {
          re = R"([a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)+)";
        } else {
          fail(path, "format '" + f + "' is not supported", "use date, time, date-time, uuid or email, or a pattern");
        }
      }
      try {
        return "(\"\\\"\" " + regex_to_ebnf(re, RegexContext::kJsonString) + " \"\\\"\")";
      } catch (const Error& e) {
        fail(path, e.what(), "simplify the pattern");
      }
    }
    if (!lengths) return "json_string";
    if (lo && *lo < 0) fail(path, "'minLength' below 0", "use 0 or more");
    if (hi && lo && *hi < *lo) fail(path, "'maxLength' below 'minLength'", "fix the lengths");
    if ((hi && *hi > kMaxRepeat) || (lo && *lo > kMaxRepeat)) {
      fail(path, "a length above " + std::to_string(kMaxRepeat), "leave maxLength out and bound the output with max_tokens");
    }
    const std::string rep = "{" + std::to_string(lo.value_or(0)) + "," + (hi ? std::to_string(*hi) : "") + "}";
    return "(\"\\\"\" json_char" + rep + " \"\\\"\")";
  }

  std::string object(const Json& s, const std::string& path, int depth) {
    struct Prop {
      std::string kv;
      bool required;
    };
    std::vector<Prop> props;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail(path, "'required' must be an array of names", "list the property names");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) fail(path, "'required' lists something that is not a string", "list the property names");
        required.insert(r.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) fail(path, "'properties' must be an object", "map names to schemas");
      for (const auto& [k, v] : s["properties"].items()) {
        const std::string sub = value(v, path + "/properties/" + pointer_escape(k), depth + 1);
        props.push_back({ebnf_literal(Json(k).dump() + ":") + " " + sub, required.count(k) > 0});
      }
    }
    for (const auto& r : required) {
      if (!s.contains("properties") || !s["properties"].contains(r)) {
        fail(path, "required property '" + r + "' is not in 'properties'", "add it to 'properties' (additional properties are off unless 'additionalProperties' says otherwise)");
      }
    }
    std::string addl;
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) {
        addl = "json_string \":\" " + value(a, path + "/additionalProperties", depth + 1);
      }
    }
    const std::string name = new_rule("obj" + path);
    // S(i): nothing written yet, the first property written is i or later;
    // R(i): something written, properties i and later may follow.
    const std::size_t n = props.size();
    std::vector<std::string> S(n + 1), R(n + 1);
    R[n] = addl.empty() ? "" : "(\",\" " + addl + ")*";
    S[n] = addl.empty() ? "" : "(" + addl + " (\",\" " + addl + ")*)?";
    for (std::size_t i = n; i-- > 0;) {
      const std::string r_next = new_rule(name + "_r");
      set_rule(r_next, R[i + 1].empty() ? "\"\"" : R[i + 1]);
      R[i] = props[i].required ? "\",\" " + props[i].kv + " " + r_next : "(\",\" " + props[i].kv + ")? " + r_next;
      const std::string s_next = new_rule(name + "_s");
      set_rule(s_next, S[i + 1].empty() ? "\"\"" : S[i + 1]);
      S[i] = props[i].required ? props[i].kv + " " + r_next : "(" + props[i].kv + " " + r_next + " | " + s_next + ")";
    }
    set_rule(name, "\"{\" " + (S[0].empty() ? std::string() : S[0] + " ") + "\"}\"");
    return name;
  }

  std::string array(const Json& s, const std::string& path, int depth) {
    const auto lo = get_int(s, "minItems", path, *this), hi = get_int(s, "maxItems", path, *this);
    const int64_t m = lo.value_or(0);
    int64_t M = hi.value_or(-1);
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) fail(path, "'prefixItems' must be an array", "list the schemas");
      for (std::size_t k = 0; k < s["prefixItems"].size(); ++k) {
        prefix.push_back(value(s["prefixItems"][k], path + "/prefixItems/" + std::to_string(k), depth + 1));
      }
    }
    std::string item = "json_value";
    if (s.contains("items")) {
      const Json& it = s["items"];
      if (it.is_boolean() && !it.get<bool>()) {
        item.clear();
        M = M < 0 ? static_cast<int64_t>(prefix.size()) : std::min<int64_t>(M, static_cast<int64_t>(prefix.size()));
      } else {
        item = value(it, path + "/items", depth + 1);
      }
    }
    if (m < 0 || (M >= 0 && M < m)) fail(path, "no count of items fits minItems/maxItems", "fix the bounds");
    if (m > kMaxRepeat || M > kMaxRepeat) fail(path, "an item count above " + std::to_string(kMaxRepeat), "leave maxItems out and bound the output with max_tokens");
    const int64_t k = static_cast<int64_t>(prefix.size());
    // tail(j): what may follow after j items.
    const auto tail = [&](auto&& self, int64_t j) -> std::string {
      if (M >= 0 && j >= M) return "";
      if (j >= k) {
        if (item.empty()) return "";
        const int64_t need = std::max<int64_t>(0, m - j);
        std::string out = need ? "(\",\" " + item + "){" + std::to_string(need) + "}" : "";
        const std::string more = M < 0 ? "(\",\" " + item + ")*" : (M - j - need > 0 ? "(\",\" " + item + "){0," + std::to_string(M - j - need) + "}" : "");
        return out.empty() ? more : (more.empty() ? out : out + " " + more);
      }
      const std::string rest = self(self, j + 1);
      const std::string step = "\",\" " + prefix[static_cast<std::size_t>(j)] + (rest.empty() ? "" : " " + rest);
      return j < m ? step : "(" + step + ")?";
    };
    const std::string name = new_rule("arr" + path);
    std::string body;
    if (M == 0 || (k == 0 && item.empty())) {
      if (m > 0) fail(path, "minItems above what 'items' and 'prefixItems' allow", "fix the bounds");
      body = "\"[\" \"]\"";
    } else {
      const std::string first = k > 0 ? prefix[0] : item;
      const std::string rest = tail(tail, 1);
      const std::string elems = first + (rest.empty() ? "" : " " + rest);
      body = "\"[\" " + (m >= 1 ? elems : "(" + elems + ")?") + " \"]\"";
    }
    set_rule(name, body);
    return name;
  }

  const Json& root_;
  JsonSchemaLimits limits_;
  std::string prefix_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

std::string json_schema_to_ebnf(const nlohmann::ordered_json& schema, const JsonSchemaLimits& limits) {
  return Converter(schema, limits).rules("root") + kBasics;
}

std::string json_schema_rules(const nlohmann::ordered_json& schema, const std::string& name,
                              const JsonSchemaLimits& limits) {
  return Converter(schema, limits, name + "_").rules(name);
}

std::string json_basics_ebnf() { return kBasics; }

std::string json_object_ebnf() { return std::string("root ::= json_object\n") + kBasics; }

}  // namespace tandem::grammar
