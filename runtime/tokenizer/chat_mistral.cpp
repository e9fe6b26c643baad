#include "common/error.h"
#include "runtime/tokenizer/chat_families.h"
#include "runtime/tokenizer/py_json.h"

namespace tandem::runtime::chat {
namespace {

// The template refuses ids that are not 9 characters (Mistral's tokenizer spells them so).
void check_call_id(const std::string& id, const std::string& where) {
  if (id.size() != 9) {
    throw Error(where + ": Mistral's chat template takes tool call ids of 9 characters (got '" + id +
                "'); give ids such as 'a1B2c3D4e'");
  }
}

// A tool as the template writes it: {"type": "function", "function": {...}}
// with each field of the function but "return", a string as it is (not
// escaped: the template writes '"' + val + '"'), anything else by tojson.
std::string tool_text(const nlohmann::ordered_json& tool) {
  std::string out = "{\"type\": \"function\", \"function\": {";
  bool first = true;
  const auto f = tool.contains("function") ? tool["function"] : nlohmann::ordered_json::object();
  for (auto it = f.begin(); it != f.end(); ++it) {
    if (it.key() == "return") continue;
    out += first ? "" : ", ";
    first = false;
    out += "\"" + it.key() + "\": " + (it->is_string() ? "\"" + it->get<std::string>() + "\"" : py_json_dumps(*it));
  }
  return out + "}}";
}

bool same_message(const ChatMessage& a, const ChatMessage& b) {
  return a.role == b.role && a.content == b.content && a.tool_call_id == b.tool_call_id && a.tool_calls.empty() &&
         b.tool_calls.empty();
}

}  // namespace

// Mistral-Nemo-Instruct-2407's template (Mistral's v3 tool format with the
// Tekken tokenizer's spacing): no generation prompt of its own (every prompt
// ends where the answer begins), the system message only before the last
// message when that is a user's, the tools before the last user message.
std::string render_mistral(std::span<const ChatMessage> messages, const ChatOptions& options, const std::string& bos,
                           const std::string& eos) {
  std::size_t first = 0;
  const std::string* system = nullptr;
  if (!messages.empty() && messages[0].role == "system") {
    system = &messages[0].content;
    first = 1;
  }
  const ChatMessage* last_user = nullptr;
  std::size_t turn = 0;  // user, assistant, user, ... apart from tool results and calls
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") last_user = &m;
    if (m.role == "tool" || !m.tool_calls.empty()) continue;
    if ((m.role == "user") != (turn++ % 2 == 0)) {
      throw Error("messages[" + std::to_string(i) + "]: Mistral's chat template takes roles that alternate user/"
                  "assistant/user/... after an optional system message (tool calls and results aside)");
    }
  }
  std::string out = bos;
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (m.role == "user") {
      if (has_tools(options) && last_user && same_message(m, *last_user)) {
        out += "[AVAILABLE_TOOLS][";
        for (std::size_t k = 0; k < options.tools->size(); ++k) out += (k ? ", " : "") + tool_text((*options.tools)[k]);
        out += "][/AVAILABLE_TOOLS]";
      }
      const bool with_system = i + 1 == messages.size() && system != nullptr;
      out += "[INST]" + (with_system ? *system + "\n\n" : std::string()) + m.content + "[/INST]";
    } else if (!m.tool_calls.empty()) {
      out += "[TOOL_CALLS][";
      for (std::size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ChatToolCall& c = m.tool_calls[k];
        check_call_id(c.id, where + ".tool_calls[" + std::to_string(k) + "].id");
        const std::string fn = py_json_dumps(nlohmann::ordered_json{{"name", c.name}, {"arguments", c.arguments}});
        out += (k ? ", " : "") + fn.substr(0, fn.size() - 1) + ", \"id\": \"" + c.id + "\"}";
      }
      out += "]" + eos;
    } else if (m.role == "assistant") {
      out += m.content + eos;
    } else if (m.role == "tool") {
      check_call_id(m.tool_call_id, where + ".tool_call_id");
      out += "[TOOL_RESULTS]{\"content\": " + m.content + ", \"call_id\": \"" + m.tool_call_id + "\"}[/TOOL_RESULTS]";
    } else {
      throw Error(where + ": Mistral's chat template takes user and assistant messages (and tool results) after an "
                          "optional first system message; got role '" + m.role + "'");
    }
  }
  return out;
}

}  // namespace tandem::runtime::chat
