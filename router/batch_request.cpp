#include "router/batch_request.h"

#include "router/structured_output.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <initializer_list>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "common/error.h"
#include "common/text.h"
#include "router/body_defaults.h"
#include "router/embeddings.h"
#include "router/json_checked.h"
#include "router/line_key.h"
#include "router/tool_calls.h"

namespace tandem::router {
namespace {

using json = nlohmann::json;

// Thrown inside the parser only; turned into a LineError at the top.
struct Bad {
  std::string message;
};

std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

double number(const json& body, const char* key, double lo, double hi) {
  const json& v = body[key];
  if (!v.is_number()) throw Bad{std::string("'") + key + "' must be a number, got " + type_name(v)};
  const double d = v.get<double>();
  if (d < lo || d > hi)
    throw Bad{std::string("'") + key + "' must be between " + json(lo).dump() + " and " + json(hi).dump() +
              ", got " + v.dump()};
  return d;
}

int64_t integer(const json& body, const char* key, int64_t lo) {
  const json& v = body[key];
  if (!v.is_number_integer()) throw Bad{std::string("'") + key + "' must be an integer, got " + type_name(v)};
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw Bad{std::string("'") + key + "' must be at most " + std::to_string(INT64_MAX) + ", got " + v.dump()};
  const int64_t i = v.get<int64_t>();
  if (i < lo) throw Bad{std::string("'") + key + "' must be at least " + std::to_string(lo) + ", got " + v.dump()};
  return i;
}

std::vector<int32_t> token_ids(const json& v, const char* what) {
  if (!v.is_array() || v.empty()) throw Bad{std::string("'") + what + "' must be a non-empty array of token ids"};
  std::vector<int32_t> ids;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      throw Bad{std::string("'") + what + "' must hold non-negative integer token ids, got " + x.dump()};
    ids.push_back(x.get<int32_t>());
  }
  return ids;
}

std::string message_content(const json& m, std::size_t i) {
  const json& c = m["content"];
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  if (c.is_array()) {  // [{"type": "text", "text": ...}, ...]
    std::string out;
    for (const auto& part : c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        throw Bad{"messages[" + std::to_string(i) + "].content: only text parts are supported"};
      out += part["text"].get<std::string>();
    }
    return out;
  }
  throw Bad{"messages[" + std::to_string(i) + "].content must be a string or an array of text parts"};
}

// Every field of a request body, and what Tandem does with it. Honoured
// fields are read by parse_body. The others either change nothing in the
// output (accepted) or would change it in a way Tandem cannot honour: those
// are refused, naming the field, as is any field Tandem does not know (a
// typo such as "max_token" must not fall back to a default without a word).
// docs/run.md lists them; keep it in step.
const std::vector<std::string>& honoured_fields(bool chat) {
  static const std::vector<std::string> common = {
      "model", "max_tokens", "max_completion_tokens", "n", "stream", "stream_options", "temperature", "top_p",
      "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop",
      "stop_token_ids", "ignore_eos", "logprobs", "logit_bias", "min_tokens"};
  static const std::vector<std::string> completions = [] {
    auto v = common;
    v.insert(v.end(), {"prompt", "prompt_token_ids", "echo", "prompt_logprobs"});
    return v;
  }();
  static const std::vector<std::string> chat_fields = [] {
    auto v = common;
    v.insert(v.end(), {"messages", "top_logprobs"});
    return v;
  }();
  return chat ? chat_fields : completions;
}

bool one_of(const std::string& key, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), key) != names.end();
}

// Fields that never change the output (bookkeeping for OpenAI's service).
bool no_effect(const std::string& key) {
  return one_of(key, {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
                      "priority"});
}

std::string unsupported(const std::string& key, const std::string& why) {
  return "'" + key + "' is not supported: " + why + "; remove it (docs/run.md lists the fields Tandem honours)";
}

// Throws Bad for a field that would change the result and is not honoured,
// or one Tandem does not know; values that ask for the default are accepted.
void check_fields(const json& body, bool chat, bool batch_line) {
  const auto& honoured = honoured_fields(chat);
  for (const auto& [key, v] : body.items()) {
    if (std::find(honoured.begin(), honoured.end(), key) != honoured.end() || no_effect(key)) continue;
    if (batch_line && one_of(key, {"custom_id", "method", "url"})) continue;  // a short-form line's own fields
    if (v.is_null()) continue;  // null asks for the default everywhere in OpenAI's API
    if (is_structured_output_field(key)) continue;  // parse_body reads them (structured_output.h)
    if (is_tool_field(key)) {
      if (chat) continue;  // parse_body reads them (tool_calls.h)
      if ((v.is_array() && v.empty()) || v == "none") continue;
      throw Bad{unsupported(key, "tools are for chat completions (/v1/chat/completions with messages)")};
    }
    if (key == "chat_template_kwargs" && chat) continue;  // parse_prompt reads it
    if (key == "best_of") {
      if (v.is_number_integer() && v.get<int64_t>() == 1) continue;
      throw Bad{unsupported(key, "best_of above 1 is not implemented; write one line per sample instead")};
    }
    if (key == "modalities") {
      if (v == json::array({"text"})) continue;
      throw Bad{unsupported(key, "only text output is produced")};
    }
    if (key == "skip_special_tokens" && v == true) continue;  // what Tandem does
    if (one_of(key, {"include_stop_str_in_output", "use_beam_search"}) && v == false) continue;
    if (key == "spaces_between_special_tokens" && v == true) continue;
    if (one_of(key, {"suffix", "guided_decoding_backend", "reasoning_effort", "chat_template", "chat_template_kwargs",
                     "add_generation_prompt", "continue_final_message", "documents", "include_stop_str_in_output",
                     "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens", "bad_words",
                     "allowed_token_ids", "logits_processors", "use_beam_search", "length_penalty", "audio",
                     "prediction", "web_search_options", "top_a", "typical_p", "mirostat"}))
      throw Bad{unsupported(key, "Tandem does not implement it, and ignoring it would change the output")};
    const auto hint = closest_match(key, honoured);
    throw Bad{"unknown field '" + key + "'" + (hint ? "; did you mean '" + *hint + "'?" : std::string()) +
              " (docs/run.md lists the fields Tandem reads)"};
  }
}

// OpenAI's logit_bias: {"token id": bias in -100..100}, as (id, bias) sorted by id.
std::vector<std::pair<int32_t, float>> logit_bias_of(const json& v) {
  if (!v.is_object()) throw Bad{"'logit_bias' must be an object of {\"token id\": bias}"};
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [id, bias] : v.items()) {
    int64_t t = -1;
    const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), t);
    if (ec != std::errc() || end != id.data() + id.size() || t < 0 || t > INT32_MAX)
      throw Bad{"'logit_bias' keys must be token ids (non-negative integers as strings), got " + json(id).dump()};
    if (!bias.is_number() || bias.get<double>() < -100 || bias.get<double>() > 100)
      throw Bad{"'logit_bias' values must be numbers from -100 to 100, got " + bias.dump() + " for token " + id};
    out.emplace_back(static_cast<int32_t>(t), bias.get<float>());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool given(const json& body, const char* key);

// A chat message's fields: role, content, reasoning_content, tool_calls and tool_call_id are
// read; name is not rendered by the chat templates Tandem knows (nor by the models' own), so it
// changes nothing.
void check_message_fields(const json& m, std::size_t i) {
  for (const auto& [key, v] : m.items()) {
    if (one_of(key, {"role", "content", "reasoning_content", "name", "tool_call_id", "refusal", "tool_calls"})) continue;
    if (v.is_null() || (v.is_array() && v.empty())) continue;
    const std::string where = "messages[" + std::to_string(i) + "]." + key;
    if (key == "function_call")
      throw Bad{"'" + where + "' is OpenAI's deprecated form; give the call in 'tool_calls'"};
    throw Bad{"unknown field '" + where + "' (a message has role, content, and for assistants reasoning_content "
              "and tool_calls, for tools tool_call_id)"};
  }
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
std::vector<runtime::ChatToolCall> message_tool_calls(const nlohmann::ordered_json& v, std::size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].tool_calls";
  std::vector<runtime::ChatToolCall> out;
  if (v.is_null()) return out;
  if (!v.is_array()) throw Bad{"'" + where + "' must be an array of {\"id\", \"type\": \"function\", \"function\"}"};
  for (std::size_t k = 0; k < v.size(); ++k) {
    const auto& c = v[k];
    const std::string at = where + "[" + std::to_string(k) + "]";
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      throw Bad{"'" + at + "' must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}"};
    for (const auto& [key, x] : c.items()) {
      if (key == "type" && x != "function") throw Bad{"'" + at + ".type' must be \"function\""};
      if (key != "id" && key != "type" && key != "function" && key != "index")
        throw Bad{"'" + at + "." + key + "' is not a field of a tool call (it has id, type and function)"};
    }
    const auto& f = c["function"];
    for (const auto& [key, x] : f.items()) {
      if (key != "name" && key != "arguments")
        throw Bad{"'" + at + ".function." + key + "' is not a field of a call (it has name and arguments)"};
    }
    if (!f.contains("name") || !f["name"].is_string()) throw Bad{"'" + at + ".function.name' must be a string"};
    if (!f.contains("arguments") || !(f["arguments"].is_string() || f["arguments"].is_object()))
      throw Bad{"'" + at + ".function.arguments' must be a JSON string (or an object)"};
    runtime::ChatToolCall call;
    if (c.contains("id") && !c["id"].is_null()) {
      if (!c["id"].is_string()) throw Bad{"'" + at + ".id' must be a string"};
      call.id = c["id"].get<std::string>();
    }
    call.name = f["name"].get<std::string>();
    call.arguments = f["arguments"];
    out.push_back(std::move(call));
  }
  return out;
}

// chat_template_kwargs: Qwen3's enable_thinking and Llama 3.1's date_string
// are read (a template that has neither refuses them); any other variable
// would change the prompt in a way Tandem's templates do not render.
void template_kwargs(const json& body, BatchRequest& r) {
  if (!given(body, "chat_template_kwargs")) return;
  const json& v = body["chat_template_kwargs"];
  if (!v.is_object()) throw Bad{"'chat_template_kwargs' must be an object such as {\"enable_thinking\": false}"};
  for (const auto& [key, x] : v.items()) {
    if (key != "enable_thinking" && key != "date_string")
      throw Bad{unsupported("chat_template_kwargs." + key, "Tandem's chat templates read only enable_thinking "
                                                           "(Qwen3) and date_string (Llama 3.1+)")};
    if (x.is_null()) continue;
    if (key == "enable_thinking") {
      if (!x.is_boolean()) throw Bad{"'chat_template_kwargs.enable_thinking' must be true or false"};
      r.enable_thinking = x.get<bool>();
    } else {
      if (!x.is_string()) throw Bad{"'chat_template_kwargs.date_string' must be a string such as \"26 Jul 2024\""};
      r.date_string = x.get<std::string>();
    }
  }
}

// Whether a field is there and not null (null asks for the default everywhere in OpenAI's API).
bool given(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

// The prompt: messages (chat), or prompt / prompt_token_ids (completions).
void parse_prompt(const json& body, BatchRequest& r, const std::function<nlohmann::ordered_json()>& ordered) {
  const bool chat = r.endpoint == Endpoint::kChat;
  if (chat) {
    if (!body.contains("messages")) throw Bad{"a chat request needs 'messages'"};
    template_kwargs(body, r);
    const json& ms = body["messages"];
    std::optional<nlohmann::ordered_json> kept;  // the messages in key order, once one holds tool calls
    if (!ms.is_array() || ms.empty()) throw Bad{"'messages' must be a non-empty array of {role, content}"};
    std::vector<runtime::ChatMessage> messages;
    for (std::size_t i = 0; i < ms.size(); ++i) {
      const json& m = ms[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw Bad{"messages[" + std::to_string(i) + "] must be an object with a string 'role'"};
      check_message_fields(m, i);
      runtime::ChatMessage cm{m["role"].get<std::string>(), message_content(m, i), std::nullopt};
      if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
        cm.reasoning_content = m["reasoning_content"].get<std::string>();
      if (given(m, "tool_calls") && !(m["tool_calls"].is_array() && m["tool_calls"].empty())) {
        if (cm.role != "assistant") throw Bad{"messages[" + std::to_string(i) + "]: only an assistant makes tool_calls"};
        if (!kept) kept = ordered()["messages"];  // an object's arguments keep their key order
        cm.tool_calls = message_tool_calls((*kept)[i]["tool_calls"], i);
      }
      if (given(m, "tool_call_id")) {
        if (!m["tool_call_id"].is_string()) throw Bad{"messages[" + std::to_string(i) + "].tool_call_id must be a string"};
        cm.tool_call_id = m["tool_call_id"].get<std::string>();
      }
      messages.push_back(std::move(cm));
    }
    r.messages = std::move(messages);
  } else if (given(body, "prompt_token_ids") && given(body, "prompt")) {
    throw Bad{"give 'prompt' or 'prompt_token_ids', not both (which one is the prompt?)"};
  } else if (given(body, "prompt_token_ids")) {
    r.prompt_ids = token_ids(body["prompt_token_ids"], "prompt_token_ids");
  } else if (given(body, "prompt")) {
    const json& p = body["prompt"];
    if (p.is_string()) {
      r.prompt_text = p.get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      r.prompt_ids = token_ids(p, "prompt");
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt_text = p[0].get<std::string>();
    } else {
      throw Bad{"'prompt' must be a string or an array of token ids (one prompt per line)"};
    }
  } else {
    throw Bad{"a completion request needs 'prompt' (or 'prompt_token_ids')"};
  }

}

// n, stream and stream_options (HTTP); a batch line takes n = 1 only.
void parse_choices(const json& body, BatchRequest& r, bool http) {
  if (http) {
    if (body.contains("n") && !body["n"].is_null()) {
      r.n = integer(body, "n", 1);
      if (r.n > kMaxChoices) throw Bad{"'n' must be at most " + std::to_string(kMaxChoices)};
    }
    if (body.contains("stream") && !body["stream"].is_null()) {
      if (!body["stream"].is_boolean()) throw Bad{"'stream' must be true or false"};
      r.stream = body["stream"].get<bool>();
    }
    if (body.contains("stream_options") && !body["stream_options"].is_null()) {
      const json& so = body["stream_options"];
      if (!so.is_object()) throw Bad{"'stream_options' must be an object"};
      if (!r.stream) throw Bad{"'stream_options' is only allowed with 'stream': true"};
      if (so.contains("include_usage") && !so["include_usage"].is_null()) {
        if (!so["include_usage"].is_boolean()) throw Bad{"'stream_options.include_usage' must be true or false"};
        r.include_usage = so["include_usage"].get<bool>();
      }
    }
  } else if (body.contains("n") && !body["n"].is_null() && integer(body, "n", 1) != 1) {
    throw Bad{"'n' must be 1 (write one line per sample, with different seeds)"};
  }
}

// Sampling and ending: temperature, top-p/k, min-p, penalties, seed, stop, logit_bias, min_tokens, ignore_eos.
void parse_sampling(const json& body, BatchRequest& r) {
  auto& p = r.params;
  if (body.contains("temperature") && !body["temperature"].is_null())
    p.temperature = static_cast<float>(number(body, "temperature", 0, 100));
  if (body.contains("top_p") && !body["top_p"].is_null()) p.top_p = static_cast<float>(number(body, "top_p", 0, 1));
  if (p.top_p <= 0) throw Bad{"'top_p' must be above 0"};
  if (body.contains("top_k") && !body["top_k"].is_null()) p.top_k = integer(body, "top_k", -1);
  if (body.contains("min_p") && !body["min_p"].is_null()) p.min_p = static_cast<float>(number(body, "min_p", 0, 1));
  if (body.contains("presence_penalty") && !body["presence_penalty"].is_null())
    p.presence_penalty = static_cast<float>(number(body, "presence_penalty", -2, 2));
  if (body.contains("frequency_penalty") && !body["frequency_penalty"].is_null())
    p.frequency_penalty = static_cast<float>(number(body, "frequency_penalty", -2, 2));
  if (body.contains("repetition_penalty") && !body["repetition_penalty"].is_null())
    p.repetition_penalty = static_cast<float>(number(body, "repetition_penalty", 0.01, 100));
  if (body.contains("seed") && !body["seed"].is_null()) {
    const json& s = body["seed"];
    if (!s.is_number_integer()) throw Bad{"'seed' must be an integer, got " + type_name(s)};
    if (!s.is_number_unsigned())  // a negative seed has no meaning of its own (some clients mean "random")
      throw Bad{"'seed' must be an integer from 0 to 2^64-1, got " + s.dump() +
                "; leave it out for the job's seed (job.seed with the custom_id)"};
    p.seed = s.get<uint64_t>();
    r.seed_given = true;
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& s = body["stop"];
    if (s.is_string()) p.stop = {s.get<std::string>()};
    else if (s.is_array()) {
      for (const auto& x : s) {
        if (!x.is_string()) throw Bad{"'stop' must be a string or an array of strings"};
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      throw Bad{"'stop' must be a string or an array of strings"};
    }
  }
  if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null())
    p.stop_token_ids = token_ids(body["stop_token_ids"], "stop_token_ids");
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) p.logit_bias = logit_bias_of(body["logit_bias"]);
  if (body.contains("min_tokens") && !body["min_tokens"].is_null()) {
    p.min_tokens = integer(body, "min_tokens", 0);
    if (r.max_tokens_given && p.min_tokens > p.max_tokens)
      throw Bad{"'min_tokens' (" + std::to_string(p.min_tokens) + ") must be at most max_tokens (" +
                std::to_string(p.max_tokens) + ")"};
  }
  if (body.contains("ignore_eos") && !body["ignore_eos"].is_null()) {
    if (!body["ignore_eos"].is_boolean()) throw Bad{"'ignore_eos' must be true or false"};
    p.ignore_eos = body["ignore_eos"].get<bool>();
  }
}

// logprobs (completions: a number; chat: true with top_logprobs), echo and prompt_logprobs.
void parse_logprobs(const json& body, BatchRequest& r) {
  auto& p = r.params;
  const bool chat = r.endpoint == Endpoint::kChat;
  if (chat) {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      if (!body["logprobs"].is_boolean()) throw Bad{"'logprobs' must be true or false for chat completions"};
      r.chat_logprobs = body["logprobs"].get<bool>();
    }
    const bool top = body.contains("top_logprobs") && !body["top_logprobs"].is_null();
    if (top && !r.chat_logprobs) throw Bad{"'top_logprobs' needs 'logprobs': true (as OpenAI's API requires)"};
    if (r.chat_logprobs) {
      p.logprobs = 0;
      if (top) p.logprobs = integer(body, "top_logprobs", 0);
      if (p.logprobs > 20) throw Bad{"'top_logprobs' must be at most 20"};
    }
  } else {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      p.logprobs = integer(body, "logprobs", 0);
      if (p.logprobs > 20) throw Bad{"'logprobs' must be at most 20"};
    }
    if (body.contains("echo") && !body["echo"].is_null()) {
      if (!body["echo"].is_boolean()) throw Bad{"'echo' must be true or false"};
      r.echo = body["echo"].get<bool>();
      if (r.echo && p.logprobs >= 0) p.prompt_logprobs = p.logprobs;
    }
    if (body.contains("prompt_logprobs") && !body["prompt_logprobs"].is_null()) {
      p.prompt_logprobs = integer(body, "prompt_logprobs", 0);
      if (p.prompt_logprobs > 20) throw Bad{"'prompt_logprobs' must be at most 20"};
      r.prompt_logprobs_asked = true;
    }
  }
}

// response_format, structured_outputs, guided_*: the grammar the output must follow.
// tools, tool_choice, parallel_tool_calls (the grammar of calls is settled by build_prompt, which
// knows the model's call format), then response_format and the other structured outputs.
void parse_structured(const json& body, BatchRequest& r, const std::function<nlohmann::ordered_json()>& ordered) {
  try {
    bool any_tool_field = false;
    for (const auto& [key, v] : body.items()) any_tool_field |= is_tool_field(key) && !v.is_null();
    if (any_tool_field) {
      if (auto t = parse_tools(ordered())) r.tools = std::make_shared<const ToolRequest>(std::move(*t));
    }
    r.params.grammar = structured_output_ebnf(body, ordered);
  } catch (const Error& e) {
    throw Bad{e.what()};
  }
  if (r.tools && r.tools->choice != ToolChoice::kNone && !r.params.grammar.empty()) {
    throw Bad{"'tools' (unless tool_choice is \"none\") and a structured output both constrain the answer; give one"};
  }
  if (r.params.grammar.empty() && !r.tools) return;
  if (r.params.ignore_eos) throw Bad{"'ignore_eos' cannot be combined with a structured output: the grammar decides where the output ends"};
  if (r.params.min_tokens > 0) {
    throw Bad{"'min_tokens' cannot be combined with a structured output: the grammar decides where the output ends"};
  }
}

void parse_body(const json& body, BatchRequest& r, int64_t default_max_tokens, bool http, bool short_form,
                const std::function<nlohmann::ordered_json()>& ordered) {
  if (r.endpoint == Endpoint::kEmbeddings) {
    try {
      return read_embedding_body(body, r, short_form, no_effect);
    } catch (const Error& e) {
      throw Bad{e.what()};
    }
  }
  if (!body.is_object()) throw Bad{"'body' must be an object"};
  check_fields(body, r.endpoint == Endpoint::kChat, short_form);
  if (body.contains("model")) {
    if (!body["model"].is_string()) throw Bad{"'model' must be a string"};
    r.model = body["model"].get<std::string>();
  }
  parse_prompt(body, r, ordered);
  auto& p = r.params;
  p.max_tokens = default_max_tokens;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (body.contains(key) && !body[key].is_null()) {
      p.max_tokens = integer(body, key, 1);
      r.max_tokens_given = true;
    }
  }
  parse_choices(body, r, http);
  parse_sampling(body, r);
  parse_logprobs(body, r);
  parse_structured(body, r, ordered);
}

}  // namespace

ParsedLine parse_batch_line(std::string_view line, int64_t default_max_tokens, const BodyDefaults* defaults) {
  std::string duplicate;
  json j = parse_checked(line, duplicate);
  if (j.is_discarded()) {
    return LineError{line_key_id(line), 400, "not valid JSON" + where_json_breaks(line) + "; each line must be one JSON object"};
  }
  if (!j.is_object()) return LineError{"", 400, "each line must be a JSON object, got " + type_name(j)};
  // The error record names the first custom_id, as the line is keyed by (router/line_key.h).
  if (!duplicate.empty()) return LineError{line_key_id(line), 400, duplicate_message(duplicate)};
  LineError err;
  if (j.contains("custom_id") && j["custom_id"].is_string()) err.custom_id = j["custom_id"].get<std::string>();
  const bool use_defaults = defaults && !defaults->empty();
  try {
    if (!j.contains("custom_id")) throw Bad{"missing 'custom_id' (every line needs a unique string id)"};
    if (!j["custom_id"].is_string() || err.custom_id.empty())
      throw Bad{"'custom_id' must be a non-empty string, got " + j["custom_id"].dump()};
    BatchRequest r;
    r.custom_id = err.custom_id;
    if (j.contains("body")) {
      const std::string url = j.value("url", "");
      if (url == "/v1/completions") r.endpoint = Endpoint::kCompletions;
      else if (url == "/v1/chat/completions") r.endpoint = Endpoint::kChat;
      else if (url == "/v1/embeddings") r.endpoint = Endpoint::kEmbeddings;
      else throw Bad{"unknown 'url' " + json(url).dump() +
                     "; use \"/v1/completions\", \"/v1/chat/completions\" or \"/v1/embeddings\""};
      if (j.contains("method") && j["method"] != "POST") throw Bad{"'method' must be \"POST\""};
      if (!use_defaults) {
        parse_body(j["body"], r, default_max_tokens, false, false,
                   [&] { return nlohmann::ordered_json::parse(line)["body"]; });
      } else {
        parse_body(defaults->merged(j["body"]), r, default_max_tokens, false, false,
                   [&] { return defaults->merged(nlohmann::ordered_json::parse(line)["body"]); });
      }
    } else {
      // Short form: the request's fields sit next to custom_id.
      r.endpoint = j.contains("messages")                                               ? Endpoint::kChat
                   : j.contains("input") && !j.contains("prompt") && !j.contains("prompt_token_ids") ? Endpoint::kEmbeddings
                                                                                            : Endpoint::kCompletions;
      if (!use_defaults) {
        parse_body(j, r, default_max_tokens, false, true, [&] { return nlohmann::ordered_json::parse(line); });
      } else {
        if (!j.contains("messages") && !j.contains("prompt") && !j.contains("prompt_token_ids") &&
            defaults->body.contains("messages"))
          r.endpoint = Endpoint::kChat;  // the defaults' messages alone make it a chat
        parse_body(defaults->merged(j), r, default_max_tokens, false, true,
                   [&] { return defaults->merged(nlohmann::ordered_json::parse(line)); });
      }
    }
    return r;
  } catch (const Bad& b) {
    err.message = b.message;
    if (use_defaults && std::holds_alternative<BatchRequest>(parse_batch_line(line, default_max_tokens)))
      err.message += kDefaultsHint;
    return err;
  } catch (const json::exception& e) {
    err.message = std::string("malformed request: ") + e.what();
    return err;
  }
}

ParsedLine parse_request_body(Endpoint endpoint, std::string_view text, int64_t default_max_tokens) {
  std::string duplicate;
  json body = parse_checked(text, duplicate);
  if (body.is_discarded()) return LineError{"", 400, "the request body is not valid JSON"};
  if (!body.is_object()) return LineError{"", 400, "the request body must be a JSON object, got " + type_name(body)};
  if (!duplicate.empty()) return LineError{"", 400, duplicate_message(duplicate)};
  try {
    BatchRequest r;
    r.endpoint = endpoint;
    parse_body(body, r, default_max_tokens, true, false, [&] { return nlohmann::ordered_json::parse(text); });
    return r;
  } catch (const Bad& b) {
    return LineError{"", 400, b.message};
  } catch (const json::exception& e) {
    return LineError{"", 400, std::string("malformed request: ") + e.what()};
  }
}

uint64_t sampling_key(bool seed_given, uint64_t seed, uint64_t job_seed, const std::string& custom_id) {
  if (seed_given) return XXH3_64bits_withSeed("seed", 4, seed);
  return XXH3_64bits_withSeed(custom_id.data(), custom_id.size(), job_seed);
}

}  // namespace tandem::router

