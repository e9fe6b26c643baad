#include "router/batch_request.h"

#include <nlohmann/json.hpp>

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

void parse_body(const json& body, BatchRequest& r, int64_t default_max_tokens, bool http) {
  if (!body.is_object()) throw Bad{"'body' must be an object"};
  if (body.contains("model")) {
    if (!body["model"].is_string()) throw Bad{"'model' must be a string"};
    r.model = body["model"].get<std::string>();
  }
  const bool chat = r.endpoint == Endpoint::kChat;
  if (chat) {
    if (!body.contains("messages")) throw Bad{"a chat request needs 'messages'"};
    const json& ms = body["messages"];
    if (!ms.is_array() || ms.empty()) throw Bad{"'messages' must be a non-empty array of {role, content}"};
    std::vector<runtime::ChatMessage> messages;
    for (std::size_t i = 0; i < ms.size(); ++i) {
      const json& m = ms[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw Bad{"messages[" + std::to_string(i) + "] must be an object with a string 'role'"};
      runtime::ChatMessage cm{m["role"].get<std::string>(), message_content(m, i), std::nullopt};
      if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
        cm.reasoning_content = m["reasoning_content"].get<std::string>();
      messages.push_back(std::move(cm));
    }
    r.messages = std::move(messages);
  } else if (body.contains("prompt_token_ids")) {
    r.prompt_ids = token_ids(body["prompt_token_ids"], "prompt_token_ids");
  } else if (body.contains("prompt")) {
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

  auto& p = r.params;
  p.max_tokens = default_max_tokens;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (body.contains(key) && !body[key].is_null()) {
      p.max_tokens = integer(body, key, 1);
      r.max_tokens_given = true;
    }
  }
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
    p.seed = static_cast<uint64_t>(s.get<int64_t>());
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
  if (body.contains("ignore_eos") && !body["ignore_eos"].is_null()) {
    if (!body["ignore_eos"].is_boolean()) throw Bad{"'ignore_eos' must be true or false"};
    p.ignore_eos = body["ignore_eos"].get<bool>();
  }
  if (chat) {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      if (!body["logprobs"].is_boolean()) throw Bad{"'logprobs' must be true or false for chat completions"};
      r.chat_logprobs = body["logprobs"].get<bool>();
    }
    if (r.chat_logprobs) {
      p.logprobs = 0;
      if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) p.logprobs = integer(body, "top_logprobs", 0);
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
    if (body.contains("prompt_logprobs") && !body["prompt_logprobs"].is_null())
      p.prompt_logprobs = integer(body, "prompt_logprobs", 0);
  }
}

// A line that is not valid JSON, read as far as it goes: where it breaks, and
// the top-level custom_id if one came before that point (so the error line
// can carry it, as a user matching errors to requests needs).
struct Salvage : nlohmann::json_sax<json> {
  int depth = 0;
  bool id_next = false;
  std::string custom_id;
  std::size_t at = 0;
  std::string why;

  bool value() { return id_next = false, true; }
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool string(string_t& s) override {
    if (id_next) custom_id = s;
    return value();
  }
  bool start_object(std::size_t) override { return id_next = false, ++depth, true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return id_next = false, ++depth, true; }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override { return id_next = depth == 1 && k == "custom_id", true; }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    at = position;
    // nlohmann's text from "column" ("... parse error at line 1, column 9: syntax error ...": the line is one
    // line), else after its "[json.exception...] " tag ("number overflow parsing '1e400'").
    const std::string what = e.what();
    const auto column = what.find("column "), tag = what.find("] ");
    why = column != std::string::npos ? what.substr(column)
          : tag != std::string::npos  ? "byte " + std::to_string(position) + " (" + what.substr(tag + 2) + ")"
                                      : std::string();
    return false;
  }
};

}  // namespace

ParsedLine parse_batch_line(std::string_view line, int64_t default_max_tokens) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    Salvage s;
    json::sax_parse(line, &s, json::input_format_t::json, /*strict=*/true);
    const std::string where = !s.why.empty() ? " at " + s.why : s.at > 0 ? " at byte " + std::to_string(s.at) : "";
    return LineError{s.custom_id, 400, "not valid JSON" + where + "; each line must be one JSON object"};
  }
  if (!j.is_object()) return LineError{"", 400, "each line must be a JSON object, got " + type_name(j)};
  LineError err;
  if (j.contains("custom_id") && j["custom_id"].is_string()) err.custom_id = j["custom_id"].get<std::string>();
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
      else throw Bad{"unknown 'url' " + json(url).dump() + "; use \"/v1/completions\" or \"/v1/chat/completions\""};
      if (j.contains("method") && j["method"] != "POST") throw Bad{"'method' must be \"POST\""};
      parse_body(j["body"], r, default_max_tokens, false);
    } else {
      // Short form: the request's fields sit next to custom_id.
      r.endpoint = j.contains("messages") ? Endpoint::kChat : Endpoint::kCompletions;
      parse_body(j, r, default_max_tokens, false);
    }
    return r;
  } catch (const Bad& b) {
    err.message = b.message;
    return err;
  } catch (const json::exception& e) {
    err.message = std::string("malformed request: ") + e.what();
    return err;
  }
}

ParsedLine parse_request_body(Endpoint endpoint, std::string_view text, int64_t default_max_tokens) {
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return LineError{"", 400, "the request body is not valid JSON"};
  if (!body.is_object()) return LineError{"", 400, "the request body must be a JSON object, got " + type_name(body)};
  try {
    BatchRequest r;
    r.endpoint = endpoint;
    parse_body(body, r, default_max_tokens, true);
    return r;
  } catch (const Bad& b) {
    return LineError{"", 400, b.message};
  } catch (const json::exception& e) {
    return LineError{"", 400, std::string("malformed request: ") + e.what()};
  }
}

}  // namespace tandem::router
