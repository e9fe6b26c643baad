#include "router/tool_calls.h"

#include <algorithm>
#include <functional>
#include <set>

#include "common/error.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar/text_without.h"
#include "router/batch_output.h"

namespace tandem::router {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";
constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";

bool given(const ojson& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

// OpenAI's rule for function names.
bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

std::string read_tool(const ojson& tool, std::size_t i) {
  const std::string where = "tools[" + std::to_string(i) + "]";
  if (!tool.is_object()) throw Error("'" + where + "' must be {\"type\": \"function\", \"function\": {...}}");
  for (const auto& [k, v] : tool.items()) {
    if (k != "type" && k != "function")
      throw Error("'" + where + "." + k + "' is not a field of a tool (it has type and function); remove it");
  }
  if (!tool.contains("type") || tool["type"] != "function")
    throw Error("'" + where + ".type' must be \"function\" (the only kind of tool Tandem calls)");
  if (!tool.contains("function") || !tool["function"].is_object())
    throw Error("'" + where + ".function' must be an object {\"name\", \"description\", \"parameters\"}");
  const ojson& f = tool["function"];
  for (const auto& [k, v] : f.items()) {
    const std::string at = where + ".function." + k;
    if (k == "name") continue;
    if (k == "description") {
      if (!v.is_string() && !v.is_null()) throw Error("'" + at + "' must be a string");
    } else if (k == "parameters") {
      if (!v.is_object() && !v.is_null()) throw Error("'" + at + "' must be a JSON schema (an object)");
    } else if (k == "strict") {
      if (!v.is_boolean() && !v.is_null()) throw Error("'" + at + "' must be true or false");
    } else {
      throw Error("'" + at + "' is not a field of a function (it has name, description, parameters and strict); "
                  "remove it");
    }
  }
  if (!f.contains("name") || !f["name"].is_string() || !valid_name(f["name"].get<std::string>()))
    throw Error("'" + where + ".function.name' must be 1 to 64 letters, digits, '_' or '-'");
  return f["name"].get<std::string>();
}

ToolChoice read_choice(const ojson& v, const ToolRequest& t, std::string& named) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "none") return ToolChoice::kNone;
    if (s == "auto") return ToolChoice::kAuto;
    if (s == "required") return ToolChoice::kRequired;
  } else if (v.is_object() && v.value("type", "") == "function" && v.contains("function") &&
             v["function"].is_object() && v["function"].contains("name") && v["function"]["name"].is_string() &&
             v.size() == 2 && v["function"].size() == 1) {
    named = v["function"]["name"].get<std::string>();
    if (std::find(t.names.begin(), t.names.end(), named) == t.names.end())
      throw Error("'tool_choice' names the function '" + named + "', which is not in 'tools'");
    return ToolChoice::kNamed;
  }
  throw Error("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
              "{\"name\": ...}}, got " + v.dump());
}

// The arguments' schema of tool i: its parameters, or none (an empty object).
ojson parameters_of(const ToolRequest& t, std::size_t i) {
  const ojson& f = t.tools[i]["function"];
  if (f.contains("parameters") && !f["parameters"].is_null()) return f["parameters"];
  return ojson{{"type", "object"}, {"properties", ojson::object()}};
}

// The rules of every function's call in one format: fnI (its arguments'
// schema) and callI (`spell(name, "fnI")`, the call as the format writes it);
// `calls`: the alternation of those tool_choice allows.
struct CallRules {
  std::string rules;
  std::string calls;
};

CallRules call_rules(const ToolRequest& t, const std::function<std::string(const std::string&, const std::string&)>& spell) {
  CallRules out;
  for (std::size_t i = 0; i < t.names.size(); ++i) {
    const std::string fn = "fn" + std::to_string(i), call = "call" + std::to_string(i);
    try {
      out.rules += grammar::json_schema_rules(parameters_of(t, i), fn);
    } catch (const Error& e) {
      throw Error("function '" + t.names[i] + "' (tools[" + std::to_string(i) + "].function.parameters): " + e.what());
    }
    out.rules += call + " ::= " + spell(t.names[i], fn) + "\n";
    if (t.choice != ToolChoice::kNamed || t.names[i] == t.named) out.calls += (out.calls.empty() ? "" : " | ") + call;
  }
  out.calls = "(" + out.calls + ")";
  return out;
}

// ---- Hermes (Qwen3): <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call> ----

std::string hermes_grammar(const ToolRequest& t, bool think_first) {
  const CallRules c = call_rules(t, [](const std::string& name, const std::string& fn) {
    return grammar::ebnf_literal(std::string(kCallOpen) + "\n{\"name\": \"" + name + "\", \"arguments\": ") + " " + fn +
           " " + grammar::ebnf_literal("}\n" + std::string(kCallClose));
  });
  const bool many = t.parallel && t.choice != ToolChoice::kNamed;
  std::string root;
  switch (t.choice) {
    case ToolChoice::kNone: root = "text"; break;
    case ToolChoice::kAuto: root = "text calls?"; break;
    case ToolChoice::kRequired:
    case ToolChoice::kNamed: root = think_first ? "think? calls" : "calls"; break;
  }
  std::string out = "root ::= " + root + "\n";
  out += "text ::= " + grammar::ebnf_text_without(kCallOpen) + "\n";
  out += "think ::= " + grammar::ebnf_literal(kThinkOpen) + " " + grammar::ebnf_text_without(kThinkClose) + " " +
         grammar::ebnf_literal(std::string(kThinkClose) + "\n\n") + "\n";
  out += "calls ::= " + c.calls + (many ? " (\"\\n\" " + c.calls + ")*" : "") + "\n";
  return out + c.rules + grammar::json_basics_ebnf();
}

// ---- Mistral: [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...] ----

constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";  // one special token: <[ID]> in the grammar

std::string mistral_grammar(const ToolRequest& t, int32_t marker) {
  if (marker < 0) throw Error("the model's tokenizer has no [TOOL_CALLS] token, which Mistral's tool calls begin with");
  const CallRules c = call_rules(t, [](const std::string& name, const std::string& fn) {
    return grammar::ebnf_literal("{\"name\": \"" + name + "\", \"arguments\": ") + " " + fn + " \"}\"";
  });
  const bool many = t.parallel && t.choice != ToolChoice::kNamed;
  const std::string calls = "<[" + std::to_string(marker) + "]> \"[\" " + c.calls +
                            (many ? " (\", \" " + c.calls + ")*" : "") + " \"]\"";
  std::string root;
  switch (t.choice) {
    case ToolChoice::kNone: root = "text"; break;
    case ToolChoice::kAuto: root = "text calls?"; break;
    case ToolChoice::kRequired:
    case ToolChoice::kNamed: root = "calls"; break;
  }
  // The text never spells the marker either: the answer's only [TOOL_CALLS] is the token.
  return "root ::= " + root + "\ntext ::= " + grammar::ebnf_text_without(kMistralCalls) + "\ncalls ::= " + calls +
         "\n" + c.rules + grammar::json_basics_ebnf();
}

// ---- Llama 3.1+: the whole answer is {"name": "f", "parameters": {...}} ----

constexpr std::string_view kLlamaCall = "{\"name\": \"";

// One call at most: Meta's template holds one call per assistant turn.
std::string llama_grammar(const ToolRequest& t) {
  const CallRules c = call_rules(t, [](const std::string& name, const std::string& fn) {
    return grammar::ebnf_literal(std::string(kLlamaCall) + name + "\", \"parameters\": ") + " " + fn + " \"}\"";
  });
  std::string root;
  switch (t.choice) {
    case ToolChoice::kNone: root = "text"; break;
    case ToolChoice::kAuto: root = "calls | text"; break;
    case ToolChoice::kRequired:
    case ToolChoice::kNamed: root = "calls"; break;
  }
  return "root ::= " + root + "\ntext ::= " + grammar::ebnf_text_not_starting_with(kLlamaCall) + "\ncalls ::= " + c.calls +
         "\n" + c.rules + grammar::json_basics_ebnf();
}

std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// The end of the JSON value that starts at `at` in valid JSON text: past
// strings and nested brackets, up to a ',' or a closing bracket at its level.
std::size_t value_end(std::string_view s, std::size_t at) {
  int depth = 0;
  for (std::size_t i = at; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"') {
      for (++i; i < s.size() && s[i] != '"'; ++i) {
        if (s[i] == '\\') ++i;
      }
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (depth == 0) return i;
      --depth;
    } else if (c == ',' && depth == 0) {
      return i;
    }
  }
  return s.size();
}

// The text of member `key` of a valid JSON object's text, as written.
std::optional<std::string_view> raw_member(std::string_view obj, const std::string& key) {
  std::size_t i = obj.find('{');
  if (i == std::string_view::npos) return std::nullopt;
  ++i;
  while (i < obj.size()) {
    const std::size_t k = obj.find('"', i);
    if (k == std::string_view::npos) return std::nullopt;
    std::size_t e = k + 1;
    while (e < obj.size() && obj[e] != '"') e += obj[e] == '\\' ? 2 : 1;
    const std::string name = ojson::parse(obj.substr(k, e + 1 - k)).get<std::string>();
    const std::size_t v = obj.find(':', e + 1) + 1;
    const std::size_t end = value_end(obj, v);
    if (name == key) return trim(obj.substr(v, end - v));
    if (end >= obj.size() || obj[end] != ',') return std::nullopt;
    i = end + 1;
  }
  return std::nullopt;
}

// One call of a declared function, from the object text `inner` ("arguments" or "parameters" as `args_key`).
std::optional<ToolCall> read_call(const ToolRequest& t, std::string_view inner, const std::string& args_key,
                                  const std::string& id) {
  const ojson call = ojson::parse(inner, nullptr, /*allow_exceptions=*/false);
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string() || !call.contains(args_key) ||
      !call[args_key].is_object())
    return std::nullopt;
  const std::string name = call["name"].get<std::string>();
  if (std::find(t.names.begin(), t.names.end(), name) == t.names.end()) return std::nullopt;
  const auto args = raw_member(inner, args_key);
  if (!args) return std::nullopt;
  return ToolCall{id, name, std::string(*args)};
}

std::optional<ToolAnswer> hermes_parse(const ToolRequest& t, const std::string& text, const std::string& id_key) {
  const std::size_t first = text.find(kCallOpen);
  if (first == std::string::npos) return std::nullopt;
  ToolAnswer a;
  a.content = text.substr(0, first);
  std::size_t at = first;
  while (true) {
    const std::size_t open = text.find_first_not_of(" \t\r\n", at);
    if (open == std::string::npos) break;  // only white space after the last call
    if (text.compare(open, kCallOpen.size(), kCallOpen) != 0) return std::nullopt;  // text after a call
    const std::size_t body = open + kCallOpen.size();
    const std::size_t close = text.find(kCallClose, body);
    if (close == std::string::npos) return std::nullopt;  // cut off inside a call
    const std::string_view inner = trim(std::string_view(text).substr(body, close - body));
    auto call = read_call(t, inner, "arguments", derived_id("call_", id_key + "#" + std::to_string(a.calls.size())));
    if (!call) return std::nullopt;
    a.calls.push_back(std::move(*call));
    at = close + kCallClose.size();
  }
  return a;
}

// Mistral's call ids: 9 letters and digits (its template refuses others when they come back).
std::string mistral_id(const std::string& key) {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const std::string hex = derived_id("", key);  // 16 hex digits, the same on every run
  uint64_t h = std::stoull(hex, nullptr, 16);
  std::string id;
  for (int k = 0; k < 9; ++k, h /= 62) id += kAlnum[h % 62];
  return id;
}

// After the [TOOL_CALLS] token (kept in the text by the caller): a JSON array of calls.
std::optional<ToolAnswer> mistral_parse(const ToolRequest& t, const std::string& text, const std::string& id_key) {
  const std::size_t at = text.find(kMistralCalls);
  if (at == std::string::npos) return std::nullopt;
  const std::string_view list = trim(std::string_view(text).substr(at + kMistralCalls.size()));
  if (list.empty() || list.front() != '[' || !ojson::accept(list)) return std::nullopt;
  ToolAnswer a;
  a.content = text.substr(0, at);
  for (std::size_t i = 1; i < list.size();) {
    const std::size_t b = list.find_first_not_of(" \t\r\n,", i);
    if (b == std::string_view::npos || list[b] == ']') break;
    const std::size_t e = value_end(list, b);
    auto call = read_call(t, list.substr(b, e - b), "arguments", mistral_id(id_key + "#" + std::to_string(a.calls.size())));
    if (!call) return std::nullopt;
    a.calls.push_back(std::move(*call));
    i = e;
  }
  if (a.calls.empty()) return std::nullopt;
  return a;
}

std::optional<ToolAnswer> llama_parse(const ToolRequest& t, const std::string& text, const std::string& id_key) {
  if (text.rfind(kLlamaCall, 0) != 0) return std::nullopt;
  auto call = read_call(t, trim(text), "parameters", derived_id("call_", id_key + "#0"));
  if (!call) return std::nullopt;
  return ToolAnswer{"", {std::move(*call)}};
}

}  // namespace

bool is_tool_field(const std::string& key) {
  return key == "tools" || key == "tool_choice" || key == "parallel_tool_calls" || key == "functions" ||
         key == "function_call";
}

std::optional<ToolRequest> parse_tools(const ojson& body) {
  for (const char* legacy : {"functions", "function_call"}) {
    if (!given(body, legacy)) continue;
    const ojson& v = body[legacy];
    if ((v.is_array() && v.empty()) || v == "none") continue;
    throw Error(std::string("'") + legacy + "' is OpenAI's deprecated form of tools; give 'tools': [{\"type\": "
                "\"function\", \"function\": {...}}] and 'tool_choice' instead");
  }
  if (given(body, "parallel_tool_calls") && !body["parallel_tool_calls"].is_boolean())
    throw Error("'parallel_tool_calls' must be true or false");
  const bool has_tools = given(body, "tools") && !(body["tools"].is_array() && body["tools"].empty());
  if (!has_tools) {
    if (given(body, "tool_choice") && body["tool_choice"] != "none" && body["tool_choice"] != "auto")
      throw Error("'tool_choice' " + body["tool_choice"].dump() + " needs 'tools' to choose from");
    return std::nullopt;
  }
  if (!body["tools"].is_array()) throw Error("'tools' must be an array of {\"type\": \"function\", \"function\": {...}}");
  ToolRequest t;
  t.tools = body["tools"];
  std::set<std::string> seen;
  for (std::size_t i = 0; i < t.tools.size(); ++i) {
    std::string name = read_tool(t.tools[i], i);
    if (!seen.insert(name).second)
      throw Error("'tools[" + std::to_string(i) + "].function.name' '" + name + "' is given twice; name each function once");
    t.names.push_back(std::move(name));
  }
  if (given(body, "tool_choice")) t.choice = read_choice(body["tool_choice"], t, t.named);
  if (given(body, "parallel_tool_calls")) t.parallel = body["parallel_tool_calls"].get<bool>();
  return t;
}

std::string tool_grammar(runtime::ToolFormat format, const ToolRequest& tools, bool think_first, int32_t marker) {
  switch (format) {
    case runtime::ToolFormat::kHermes: return hermes_grammar(tools, think_first);
    case runtime::ToolFormat::kLlama3Json: return llama_grammar(tools);
    case runtime::ToolFormat::kMistral: return mistral_grammar(tools, marker);
    case runtime::ToolFormat::kNone: break;
  }
  throw Error("the chat template defines no tool calls");
}

std::optional<ToolAnswer> parse_tool_answer(runtime::ToolFormat format, const ToolRequest& tools,
                                            const std::string& text, const std::string& id_key) {
  switch (format) {
    case runtime::ToolFormat::kHermes: return hermes_parse(tools, text, id_key);
    case runtime::ToolFormat::kLlama3Json: return llama_parse(tools, text, id_key);
    case runtime::ToolFormat::kMistral: return mistral_parse(tools, text, id_key);
    case runtime::ToolFormat::kNone: break;
  }
  return std::nullopt;
}

std::size_t tool_content_end(runtime::ToolFormat format, std::string_view text) {
  if (format == runtime::ToolFormat::kNone) return text.size();
  if (format == runtime::ToolFormat::kLlama3Json) {  // a call is the whole answer: undecided while it may begin one
    const std::size_t n = std::min(text.size(), kLlamaCall.size());
    return text.substr(0, n) == kLlamaCall.substr(0, n) ? 0 : text.size();
  }
  const std::string_view marker = format == runtime::ToolFormat::kMistral ? kMistralCalls : kCallOpen;
  const std::size_t at = text.find(marker);
  if (at != std::string_view::npos) return at;
  // The longest tail that begins the marker.
  for (std::size_t n = std::min(marker.size() - 1, text.size()); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return text.size() - n;
  }
  return text.size();
}

}  // namespace tandem::router
