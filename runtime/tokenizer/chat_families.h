// The chat template families Tandem renders, one file each
// (chat_qwen3.cpp, chat_llama31.cpp, chat_mistral.cpp), and the string helpers their Jinja
// templates lean on (Python's str methods). Internal to chat_template.cpp.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "runtime/tokenizer/chat_template.h"

namespace tandem::runtime::chat {

// Jinja's `trim` (Python's str.strip(): Unicode white space).
std::string py_trim(std::string_view s);
std::string lstrip_newlines(std::string_view s);
std::string rstrip_newlines(std::string_view s);
// Python's s.split(sep)[-1] and s.split(sep)[0].
std::string_view after_last(std::string_view s, std::string_view sep);
std::string_view before_first(std::string_view s, std::string_view sep);

// Whether the options give tools (a non-empty list).
bool has_tools(const ChatOptions& options);

// Qwen3's template: <think> handling, tools in the system turn, <tool_call> and <tool_response> blocks.
std::string render_qwen3(std::span<const ChatMessage> messages, const ChatOptions& options);

// Llama 3.1 / 3.2 / 3.3's template: the dated system header, tools in the first user turn, one
// {"name", "parameters"} call per assistant turn, results as ipython turns. bos: the model's BOS text.
std::string render_llama31(std::span<const ChatMessage> messages, const ChatOptions& options, const std::string& bos);

// Mistral-Nemo's template: [INST] turns, the tools before the last user turn, [TOOL_CALLS] with 9-character
// ids, [TOOL_RESULTS]; no generation prompt of its own. bos, eos: the model's.
std::string render_mistral(std::span<const ChatMessage> messages, const ChatOptions& options, const std::string& bos,
                           const std::string& eos);

}  // namespace tandem::runtime::chat
