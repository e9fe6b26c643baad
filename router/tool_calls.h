// Tool calling: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`.
//
// The tools go into the prompt as the model's chat template renders them
// (runtime/tokenizer/chat_template.h); the answer is held to the model's own
// call format by a grammar (so a call is always well formed, names a declared
// function and has arguments valid under its parameter schema); the finished
// text is split into `content` and `message.tool_calls`. By tool_choice:
//   "none"     text only: the format's call marker cannot be written;
//   "auto"     text, then optionally calls (the default when tools are given);
//   "required" one or more calls (one with parallel_tool_calls: false),
//              after the model's thinking where its template thinks first;
//   {"type": "function", "function": {"name": F}}: one call of F.
// docs/structured-outputs.md#tools is the user's page.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/tokenizer/chat_template.h"

namespace tandem::router {

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolRequest {
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // as given: the template renders them
  std::vector<std::string> names;  // each tool's function name, in order
  ToolChoice choice = ToolChoice::kAuto;
  std::string named;               // kNamed: the function to call
  bool parallel = true;            // parallel_tool_calls: several calls in one answer
};

// The fields parse_tools reads.
bool is_tool_field(const std::string& key);

// tools, tool_choice and parallel_tool_calls of a body (parsed with its key
// order kept); nullopt when it gives no tools (an empty list is none).
// Throws tandem::Error with one line naming the field: a tool that is not
// {"type": "function", "function": {"name", "description", "parameters",
// "strict"}}, a name given twice, tool_choice naming no declared function or
// given without tools, the legacy `functions` / `function_call`.
std::optional<ToolRequest> parse_tools(const nlohmann::ordered_json& body);

// The EBNF an answer follows in `format` under the request's tool_choice.
// think_first: the template lets the model think before it answers (Qwen3
// unless enable_thinking is false), so a required call may come after a
// <think> block. marker: Mistral's [TOOL_CALLS] token id (a special token,
// <[ID]> in the grammar). Throws tandem::Error naming the tool whose
// parameters use a schema keyword the grammar does not enforce.
std::string tool_grammar(runtime::ToolFormat format, const ToolRequest& tools, bool think_first, int32_t marker = -1);

struct ToolCall {
  std::string id;         // call_… : derived from the request, so a rerun writes the same
  std::string name;
  std::string arguments;  // the JSON text the model wrote
};

struct ToolAnswer {
  std::string content;  // the text before the first call ("" when none: null in the response)
  std::vector<ToolCall> calls;
};

// A finished answer split as `format` writes calls; nullopt when the text is
// not content followed by well-formed calls of declared functions (then all
// of it is content, as a truncated answer is). id_key makes the calls' ids
// (Mistral's: 9 letters and digits, as its template wants them back). For
// Mistral the text holds the [TOOL_CALLS] token's text, which a decode that
// skips special tokens leaves out (batch_output.h's tool_answer keeps it).
std::optional<ToolAnswer> parse_tool_answer(runtime::ToolFormat format, const ToolRequest& tools,
                                            const std::string& text, const std::string& id_key);

// How much of a partial answer is content for sure: the bytes before the
// first call, or before a tail that may still become one. A stream sends
// no further than this until the answer is finished.
std::size_t tool_content_end(runtime::ToolFormat format, std::string_view text);

}  // namespace tandem::router
