#include "router/batch_output.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace tandem::router {
namespace {

using json = nlohmann::json;

std::string hex_id(const std::string& prefix, const std::string& custom_id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(custom_id.data(), custom_id.size())));
  return prefix + buf;
}

std::string token_text(const OutputContext& ctx, int32_t id) {
  return ctx.tokenizer ? ctx.tokenizer->decode(std::vector<int32_t>{id}, false) : std::string();
}

// Characters (code points) of UTF-8 text, as OpenAI's text_offset counts them.
int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// A completion's logprobs in OpenAI's legacy shape. With echo, the prompt's
// tokens come first (the first without a logprob, as nothing precedes it),
// as the text does; text_offset is each token's offset in the choice's text.
json completion_logprobs(const RequestResult& res, bool echo, const OutputContext& ctx) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  int64_t at = 0;
  auto add = [&](int32_t token, const runtime::PositionLogprobs* p) {
    const std::string text = token_text(ctx, token);
    tokens.push_back(text);
    offsets.push_back(at);
    at += code_points(text);
    if (!p) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      return;
    }
    token_logprobs.push_back(p->chosen.logprob);
    json t = json::object();
    for (const auto& c : p->top) t[token_text(ctx, c.token)] = c.logprob;
    top.push_back(t);
  };
  if (echo) {
    // prompt_logprobs[i] is the logprob of prompt token i + 1 given those before it.
    for (std::size_t i = 0; i < res.prompt_ids.size(); ++i)
      add(res.prompt_ids[i], i > 0 && i - 1 < res.prompt_logprobs.size() ? &res.prompt_logprobs[i - 1] : nullptr);
  }
  for (const auto& p : res.logprobs) add(p.chosen.token, &p);
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json chat_logprobs(const std::vector<runtime::PositionLogprobs>& lps, const OutputContext& ctx) {
  json content = json::array();
  for (const auto& p : lps) {
    json top = json::array();
    for (const auto& c : p.top) top.push_back({{"token", token_text(ctx, c.token)}, {"logprob", c.logprob}});
    content.push_back({{"token", token_text(ctx, p.chosen.token)}, {"logprob", p.chosen.logprob}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string derived_id(const std::string& prefix, const std::string& key) { return hex_id(prefix, key); }

std::optional<ToolAnswer> tool_answer(const BatchRequest& req, const std::string& text, std::span<const int32_t> tokens,
                                      const runtime::Tokenizer* tokenizer, std::size_t choice) {
  if (!req.tools || req.tools->choice == ToolChoice::kNone || req.tool_format == runtime::ToolFormat::kNone)
    return std::nullopt;
  const std::string key = req.custom_id + "/" + std::to_string(choice);
  if (req.tool_format != runtime::ToolFormat::kMistral) return parse_tool_answer(req.tool_format, *req.tools, text, key);
  const auto at = std::find(tokens.begin(), tokens.end(), req.tool_marker);
  if (at == tokens.end() || !tokenizer) return std::nullopt;
  const auto k = static_cast<std::size_t>(at - tokens.begin());
  const std::string kept = tokenizer->decode(tokens.first(k), true) + tokenizer->id_to_token(req.tool_marker) +
                           tokenizer->decode(tokens.subspan(k + 1), true);
  return parse_tool_answer(req.tool_format, *req.tools, kept, key);
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (std::size_t k = 0; k < calls.size(); ++k) {
    json c = {{"id", calls[k].id},
              {"type", "function"},
              {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}};
    if (with_index) c["index"] = k;
    out.push_back(std::move(c));
  }
  return out;
}

json response_body(const BatchRequest& req, const std::vector<RequestResult>& results, const OutputContext& ctx,
                   const std::string& id) {
  const bool chat = req.endpoint == Endpoint::kChat;
  const std::string model = req.model.empty() ? ctx.served_name : req.model;
  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const RequestResult& res = results[i];
    json choice = {{"index", i}, {"finish_reason", res.finish_reason}, {"logprobs", nullptr}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", res.text}};
      if (const auto answer = tool_answer(req, res.text, res.token_ids, ctx.tokenizer, i)) {
        choice["message"]["content"] = answer->content.empty() ? json(nullptr) : json(answer->content);
        choice["message"]["tool_calls"] = tool_calls_json(answer->calls, false);
        if (res.finish_reason == "stop") choice["finish_reason"] = "tool_calls";
      }
      if (req.params.logprobs >= 0) choice["logprobs"] = chat_logprobs(res.logprobs, ctx);
    } else {
      std::string text = res.text;
      if (req.echo) text = (req.prompt_text ? *req.prompt_text
                                            : (ctx.tokenizer ? ctx.tokenizer->decode(res.prompt_ids, false) : "")) + text;
      choice["text"] = text;
      if (req.params.logprobs >= 0) choice["logprobs"] = completion_logprobs(res, req.echo, ctx);
      if (req.prompt_logprobs_asked) {
        json pl = json::array({nullptr});
        for (const auto& p : res.prompt_logprobs) {
          json t = json::object();
          t[token_text(ctx, p.chosen.token)] = p.chosen.logprob;
          for (const auto& c : p.top) t[token_text(ctx, c.token)] = c.logprob;
          pl.push_back(t);
        }
        choice["prompt_logprobs"] = pl;
      }
    }
    choices.push_back(std::move(choice));
    prompt_tokens = static_cast<int64_t>(res.prompt_ids.size());
    completion_tokens += static_cast<int64_t>(res.token_ids.size());
  }
  return {{"id", id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", ctx.created},
          {"model", model},
          {"choices", choices},
          {"usage",
           {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}}}};
}

std::string format_result(const BatchRequest& req, const RequestResult& res, const OutputContext& ctx) {
  const bool chat = req.endpoint == Endpoint::kChat;
  json body = response_body(req, {res}, ctx, hex_id(chat ? "chatcmpl-" : "cmpl-", req.custom_id));
  json line = {{"id", hex_id("batch_req_", req.custom_id)},
               {"custom_id", req.custom_id},
               {"response", {{"status_code", 200}, {"request_id", hex_id("req_", req.custom_id)}, {"body", body}}},
               {"error", nullptr},
               {"tandem",
                {{"token_ids", res.token_ids},
                 {"ttft_ms", res.ttft_ms},
                 {"itl_ms", res.itl_ms},
                 {"e2e_ms", res.e2e_ms},
                 {"prompt_tokens_computed", res.prompt_tokens_computed},
                 {"worker", res.worker},
                 {"prefill_worker", res.prefill_worker},
                 {"kv_blocks_moved", res.kv_blocks_moved}}}};
  return dump(line);
}

std::string format_error(const LineError& err, const OutputContext&) {
  const json error = {{"message", err.message}, {"type", "invalid_request_error"}, {"param", nullptr}, {"code", nullptr}};
  // The ids hash the message too (it names the line): lines without a
  // custom_id, and a duplicate of a line that succeeded, get ids of their own.
  const std::string key = err.custom_id + '\n' + err.message;
  json line = {{"id", hex_id("batch_req_", key)},
               {"custom_id", err.custom_id.empty() ? json(nullptr) : json(err.custom_id)},
               {"response", {{"status_code", err.status}, {"request_id", hex_id("req_", key)},
                             {"body", {{"error", error}}}}},
               {"error", {{"code", "invalid_request"}, {"message", err.message}}}};
  return dump(line);
}

RequestResult result_of(std::vector<int32_t> prompt, service::WireResult r, int prefill_worker) {
  RequestResult res;
  res.prompt_ids = std::move(prompt);
  res.token_ids = std::move(r.tokens);
  res.text = std::move(r.text);
  res.finish_reason = std::move(r.finish_reason);
  res.logprobs = std::move(r.logprobs);
  res.prompt_logprobs = std::move(r.prompt_logprobs);
  res.ttft_ms = r.ttft_s * 1e3;
  res.e2e_ms = r.e2e_s * 1e3;
  const auto n = static_cast<double>(res.token_ids.size());
  res.itl_ms = n > 1 ? (res.e2e_ms - res.ttft_ms) / (n - 1) : 0.0;
  res.prompt_tokens_computed = r.prompt_tokens_computed;
  res.worker = r.worker;
  res.prefill_worker = prefill_worker;
  res.kv_blocks_moved = r.kv_blocks_moved;
  return res;
}

}  // namespace tandem::router
