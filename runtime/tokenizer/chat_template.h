// Chat templates: render OpenAI-style `messages` into the prompt text a model
// was trained on. Tandem recognises the template families it implements from
// the model's own Jinja `chat_template` (no Jinja engine): ChatML (Qwen2/2.5,
// with their default system prompts; Qwen3 with its <think> handling and its
// tools), Llama 3, Llama 3.1/3.2/3.3 (the dated system header, tools) and
// Mistral-Nemo (its [INST] turns and [TOOL_CALLS]). `model.chat_template` forces one. Renders equal the
// models' own templates (tests/data/chat_expected.json, rendered by Hugging
// Face), tools and tool calls included.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/tokenizer/tokenizer.h"

namespace tandem::runtime {

// A call an assistant made earlier in the conversation (OpenAI's
// message.tool_calls[i]).
struct ChatToolCall {
  std::string id;
  std::string name;
  nlohmann::ordered_json arguments;  // as given: OpenAI sends a JSON string, some clients an object
};

struct ChatMessage {
  std::string role;  // system | user | assistant | tool
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant: thinking kept apart from content
  std::vector<ChatToolCall> tool_calls = {};     // assistant: the calls it made
  std::string tool_call_id = {};                 // tool: the call this answers
};

struct ChatOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // Qwen3: false adds an empty <think></think> block
  std::optional<std::string> date_string;  // Llama 3.1+: "Today Date" (default: the template's "26 Jul 2024")
  // The request's `tools` as given ([{"type": "function", "function": {...}}, ...]),
  // rendered into the prompt the way the model's template does; null or empty: none.
  const nlohmann::ordered_json* tools = nullptr;
};

// How a family's models write a tool call (router/tool_calls.h reads and
// constrains them).
enum class ToolFormat {
  kNone,    // the template defines no tools: a request with tools is refused
  kHermes,  // Qwen3: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one per call
  kLlama3Json,  // Llama 3.1+: the whole answer is one {"name": ..., "parameters": {...}}
  kMistral,     // Mistral: [TOOL_CALLS] (a special token), then [{"name": ..., "arguments": {...}}, ...]
};

class ChatTemplate {
 public:
  enum class Family { kChatml, kQwen3, kLlama3, kLlama31, kMistral };

  // setting: "auto" (recognise config.chat_template), "chatml", "llama3",
  // "llama3.1" (Llama 3.1, 3.2 and 3.3's template, with its tools) or
  // "mistral" (Mistral-Nemo's, with its tools).
  // Throws tandem::Error naming `where` and the config key to set when the
  // template is missing or not recognised.
  static ChatTemplate select(std::string_view setting, const TokenizerConfig& config, const std::string& where);

  // Throws tandem::Error on a role the family does not know.
  std::string render(std::span<const ChatMessage> messages, const ChatOptions& options) const;

  Family family() const { return family_; }
  std::string_view name() const;
  ToolFormat tool_format() const;

 private:
  Family family_ = Family::kChatml;
  std::string bos_;                   // Llama 3, Mistral: put before the first message
  std::string eos_;                   // Mistral: ends each assistant turn
  std::string default_system_;        // ChatML: system prompt used when the messages have none
  bool honours_generation_prompt_ = true;  // Llama 3 (original) always appends the assistant header
};

}  // namespace tandem::runtime
