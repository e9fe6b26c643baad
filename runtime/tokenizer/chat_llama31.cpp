#include "common/error.h"
#include "runtime/tokenizer/chat_families.h"
#include "runtime/tokenizer/py_json.h"

namespace tandem::runtime::chat {
namespace {

std::string header(std::string_view role) { return "<|start_header_id|>" + std::string(role) + "<|end_header_id|>\n\n"; }

// The "custom tools" prompt of Meta's template (tools_in_user_message, its
// default): how to answer with a call, then each tool as tojson(indent=4).
std::string tools_preamble(const nlohmann::ordered_json& tools) {
  std::string out =
      "Given the following functions, please respond with a JSON for a function call with its proper arguments that "
      "best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of "
      "argument name and its value}.Do not use variables.\n\n";
  for (const auto& t : tools) out += py_json_dumps(t, 4) + "\n\n";
  return out;
}

}  // namespace

// Meta's template for Llama 3.1, 3.2 and 3.3 Instruct, as it renders without
// builtin_tools and with its defaults: tools_in_user_message = true and the
// date "26 Jul 2024" unless the request gives date_string (3.2's template
// takes today's date where the renderer offers strftime_now; Tandem keeps
// the fixed date, so a prompt does not change with the day the job runs).
std::string render_llama31(std::span<const ChatMessage> messages, const ChatOptions& options, const std::string& bos) {
  const bool tools = has_tools(options);
  std::string out = bos;
  std::size_t i = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = py_trim(messages[0].content);
    i = 1;
  }
  out += header("system");
  if (tools) out += "Environment: ipython\n";
  out += "Cutting Knowledge Date: December 2023\nToday Date: " + options.date_string.value_or("26 Jul 2024") + "\n\n" +
         system + "<|eot_id|>";
  if (tools) {
    if (i == messages.size()) {
      throw Error("the Llama 3.1 chat template puts the tools in the first user message, and there is none; add one");
    }
    out += header("user") + tools_preamble(*options.tools) + py_trim(messages[i].content) + "<|eot_id|>";
    ++i;
  }
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() != 1) {
        throw Error("messages[" + std::to_string(i) + "].tool_calls: the Llama 3.1 chat template takes one call per "
                    "assistant message (it has " + std::to_string(m.tool_calls.size()) + ")");
      }
      // The template writes tojson of the arguments, whether an object or a string (then quoted).
      out += header("assistant") + "{\"name\": \"" + m.tool_calls[0].name + "\", \"parameters\": " +
             py_json_dumps(m.tool_calls[0].arguments) + "}<|eot_id|>";
    } else if (m.role == "tool") {
      // Content that is a string is iterable to Jinja, so the template writes it with tojson: quoted.
      out += header("ipython") + py_json_dumps(m.content) + "<|eot_id|>";
    } else {
      out += header(m.role) + py_trim(m.content) + "<|eot_id|>";
    }
  }
  if (options.add_generation_prompt) out += header("assistant");
  return out;
}

}  // namespace tandem::runtime::chat
