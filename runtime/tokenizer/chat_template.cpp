#include "runtime/tokenizer/chat_template.h"

#include "common/error.h"
#include "runtime/tokenizer/chat_families.h"
#include "runtime/tokenizer/utf8.h"

namespace tandem::runtime {
namespace chat {
namespace {

// Python's str.isspace(), which Jinja's `trim` filter follows.
bool py_space(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

}  // namespace

std::string py_trim(std::string_view s) { return std::string(trim_code_points(s, true, true, py_space)); }

std::string lstrip_newlines(std::string_view s) {
  const auto b = s.find_first_not_of('\n');
  return b == std::string_view::npos ? "" : std::string(s.substr(b));
}

std::string rstrip_newlines(std::string_view s) {
  const auto e = s.find_last_not_of('\n');
  return e == std::string_view::npos ? "" : std::string(s.substr(0, e + 1));
}

// Text after the last occurrence of sep (all of s when absent), as Python's s.split(sep)[-1].
std::string_view after_last(std::string_view s, std::string_view sep) {
  const auto at = s.rfind(sep);
  return at == std::string_view::npos ? s : s.substr(at + sep.size());
}

// Text before the first occurrence of sep, as Python's s.split(sep)[0].
std::string_view before_first(std::string_view s, std::string_view sep) {
  const auto at = s.find(sep);
  return at == std::string_view::npos ? s : s.substr(0, at);
}

bool has_tools(const ChatOptions& options) {
  return options.tools != nullptr && options.tools->is_array() && !options.tools->empty();
}

}  // namespace chat

namespace {

using chat::has_tools;
using chat::py_trim;

constexpr std::string_view kFamilies = "\"chatml\", \"llama3\", \"llama3.1\" or \"mistral\"";

// A ChatML template's built-in system prompt, written as a literal
// '<|im_start|>system\n...<|im_end|>' in the Jinja text (Qwen2, Qwen2.5).
std::string chatml_default_system(const std::string& tmpl) {
  const std::string open = "'<|im_start|>system\\n";
  for (std::size_t at = tmpl.find(open); at != std::string::npos; at = tmpl.find(open, at + 1)) {
    const std::size_t b = at + open.size();
    const std::size_t e = tmpl.find("<|im_end|>", b);
    if (e == std::string::npos) break;
    std::string_view body(tmpl.data() + b, e - b);
    if (body.find('\'') != std::string_view::npos || body.empty()) continue;  // '+ messages[0].content + ...'
    return std::string(body);
  }
  return "";
}

void check_role(const ChatMessage& m, std::size_t i) {
  if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
    throw Error("messages[" + std::to_string(i) + "].role '" + m.role +
                "' is not one of system, user, assistant, tool");
  }
}

}  // namespace

ChatTemplate ChatTemplate::select(std::string_view setting, const TokenizerConfig& config, const std::string& where) {
  ChatTemplate t;
  t.bos_ = config.bos_token;
  t.eos_ = config.eos_token;
  const std::string& tmpl = config.chat_template;
  if (setting == "chatml") {
    t.family_ = Family::kChatml;
    return t;
  }
  if (setting == "llama3") {
    t.family_ = Family::kLlama3;
    t.honours_generation_prompt_ = tmpl.empty() || tmpl.find("add_generation_prompt") != std::string::npos;
    return t;
  }
  if (setting == "llama3.1") {
    t.family_ = Family::kLlama31;
    return t;
  }
  if (setting == "mistral") {
    t.family_ = Family::kMistral;
    return t;
  }
  if (setting != "auto") {
    throw Error("model.chat_template must be \"auto\", " + std::string(kFamilies) + ", got \"" + std::string(setting) +
                "\"");
  }
  if (tmpl.empty()) {
    throw Error(where + ": the model has no chat_template; set model.chat_template = " + std::string(kFamilies) +
                " in the job config, or send prompts instead of messages");
  }
  if (tmpl.find("<|im_start|>") != std::string::npos) {
    const bool qwen3 = tmpl.find("</think>") != std::string::npos && tmpl.find("reasoning_content") != std::string::npos;
    t.family_ = qwen3 ? Family::kQwen3 : Family::kChatml;
    if (!qwen3) t.default_system_ = chatml_default_system(tmpl);
    return t;
  }
  if (tmpl.find("<|start_header_id|>") != std::string::npos) {
    if (tmpl.find("Cutting Knowledge Date") != std::string::npos) {
      // Meta's template for 3.1, 3.2 and 3.3; its ipython mode (builtin_tools) is never entered here.
      t.family_ = Family::kLlama31;
      return t;
    }
    t.family_ = Family::kLlama3;
    t.honours_generation_prompt_ = tmpl.find("add_generation_prompt") != std::string::npos;
    return t;
  }
  if (tmpl.find("[AVAILABLE_TOOLS]") != std::string::npos && tmpl.find("[TOOL_CALLS]") != std::string::npos) {
    // Mistral's v3 tool format; Nemo writes "[INST]" + content, v0.3 "[INST] " + content.
    if (tmpl.find("\"[INST] \"") != std::string::npos) {
      throw Error(where + ": Mistral v0.3's chat template (\"[INST] \" with a space) is not rendered yet; Tandem "
                          "renders Mistral-Nemo's (model.chat_template = \"mistral\", which differs in spacing)");
    }
    t.family_ = Family::kMistral;
    return t;
  }
  throw Error(where + ": chat_template not recognised (Tandem renders the ChatML/Qwen, Llama 3 and Mistral-Nemo "
                      "families); set model.chat_template = " + std::string(kFamilies) + " in the job config");
}

std::string_view ChatTemplate::name() const {
  switch (family_) {
    case Family::kChatml: return "chatml";
    case Family::kQwen3: return "chatml (qwen3)";
    case Family::kLlama3: return "llama3";
    case Family::kLlama31: return "llama3.1";
    case Family::kMistral: return "mistral";
  }
  return "";
}

ToolFormat ChatTemplate::tool_format() const {
  switch (family_) {
    case Family::kQwen3: return ToolFormat::kHermes;
    case Family::kLlama31: return ToolFormat::kLlama3Json;
    case Family::kMistral: return ToolFormat::kMistral;
    default: return ToolFormat::kNone;
  }
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, const ChatOptions& options) const {
  for (std::size_t i = 0; i < messages.size(); ++i) check_role(messages[i], i);
  if (has_tools(options) && tool_format() == ToolFormat::kNone) {
    throw Error("the " + std::string(name()) + " chat template defines no tools; send the request without 'tools' "
                "(or describe the functions in a message)");
  }
  if (options.enable_thinking && family_ != Family::kQwen3) {
    throw Error("enable_thinking: the " + std::string(name()) + " chat template has no thinking switch; remove it");
  }
  if (options.date_string && family_ != Family::kLlama31) {
    throw Error("date_string: the " + std::string(name()) + " chat template writes no date; remove it");
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].tool_calls.empty() && tool_format() == ToolFormat::kNone) {
      throw Error("messages[" + std::to_string(i) + "].tool_calls: the " + std::string(name()) +
                  " chat template defines no tool calls; remove them");
    }
  }
  std::string out;

  if (family_ == Family::kLlama3) {
    for (std::size_t i = 0; i < messages.size(); ++i) {
      if (i == 0) out += bos_;
      out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" + py_trim(messages[i].content) +
             "<|eot_id|>";
    }
    if (options.add_generation_prompt || !honours_generation_prompt_)
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
  }

  if (family_ == Family::kChatml) {
    if (!default_system_.empty() && (messages.empty() || messages[0].role != "system"))
      out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }

  if (family_ == Family::kLlama31) return chat::render_llama31(messages, options, bos_);
  if (family_ == Family::kMistral) return chat::render_mistral(messages, options, bos_, eos_);
  return chat::render_qwen3(messages, options);
}

}  // namespace tandem::runtime
