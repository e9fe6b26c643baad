#include "runtime/tokenizer/chat_families.h"

#include "common/error.h"
#include "runtime/tokenizer/py_json.h"

namespace tandem::runtime::chat {
namespace {

// Qwen3's system turn when tools are given: the system message (if any), then
// the tools, one JSON object a line, and how to call them.
std::string qwen3_tools_system(std::span<const ChatMessage> messages, const nlohmann::ordered_json& tools) {
  std::string out = "<|im_start|>system\n";
  if (!messages.empty() && messages[0].role == "system") out += messages[0].content + "\n\n";
  out += "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
         "function signatures within <tools></tools> XML tags:\n<tools>";
  for (const auto& tool : tools) out += "\n" + py_json_dumps(tool);
  out += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}\n</tool_call><|im_end|>\n";
  return out;
}

// An assistant turn's calls as Qwen3 writes them: arguments given as a string
// go in verbatim, an object as tojson writes it; a new line before each call
// but a first one that opens the turn.
std::string qwen3_tool_calls(const std::vector<ChatToolCall>& calls, bool after_content) {
  std::string out;
  for (std::size_t k = 0; k < calls.size(); ++k) {
    if (k > 0 || after_content) out += "\n";
    const auto& a = calls[k].arguments;
    out += "<tool_call>\n{\"name\": \"" + calls[k].name + "\", \"arguments\": " +
           (a.is_string() ? a.get<std::string>() : py_json_dumps(a)) + "}\n</tool_call>";
  }
  return out;
}

}  // namespace

std::string render_qwen3(std::span<const ChatMessage> messages, const ChatOptions& options) {
  std::string out;
  // Qwen3: the last user query splits the conversation; assistant turns after it
  // keep their reasoning in a <think> block, earlier ones lose it.
  const std::size_t n = messages.size();
  if (has_tools(options)) {
    out += qwen3_tools_system(messages, *options.tools);
  } else if (n > 0 && messages[0].role == "system") {
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }
  std::size_t last_query = n == 0 ? 0 : n - 1;
  for (std::size_t k = n; k-- > 0;) {
    const auto& c = messages[k].content;
    const bool tool_response = c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    if (messages[k].role == "user" && !tool_response) {
      last_query = k;
      break;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& m = messages[i];
    const bool last = i + 1 == n;
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string content = m.content;
      std::string reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (m.content.find("</think>") != std::string::npos) {
        content = lstrip_newlines(after_last(m.content, "</think>"));
        reasoning = lstrip_newlines(after_last(rstrip_newlines(before_first(m.content, "</think>")), "<think>"));
      }
      if (i > last_query && (last || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" + lstrip_newlines(rstrip_newlines(reasoning)) + "\n</think>\n\n" +
               lstrip_newlines(content);
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      out += qwen3_tool_calls(m.tool_calls, !content.empty());
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (last || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (options.enable_thinking == false) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace tandem::runtime::chat
