#include "router/openai_stream.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "router/batch_output.h"

namespace tandem::router {

using json = nlohmann::json;

StreamText::StreamText(const runtime::Tokenizer* tokenizer, const std::vector<std::string>& stop,
                       runtime::ToolFormat tools, int32_t marker)
    : tools_(tools), marker_(marker) {
  if (tokenizer && marker >= 0) marker_text_ = tokenizer->id_to_token(marker);
  if (tokenizer) decoder_.emplace(*tokenizer, true);
  for (const auto& s : stop) hold_ = std::max(hold_, s.empty() ? 0 : s.size() - 1);
}

std::string StreamText::push(const std::vector<int32_t>& tokens) {
  if (!decoder_) return {};
  for (int32_t t : tokens) text_ += t == marker_ ? marker_text_ : decoder_->push(t);
  if (text_.size() <= sent_ + hold_) return {};
  std::size_t end = std::min(text_.size() - hold_, tool_content_end(tools_, text_));
  if (end <= sent_) return {};
  // Never split a UTF-8 character: back up over continuation bytes.
  while (end > sent_ && end < text_.size() && (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80) --end;
  std::string out = text_.substr(sent_, end - sent_);
  sent_ = end;
  return out;
}

std::optional<std::string> StreamText::finish(const std::string& final_text) {
  if (final_text.size() < sent_ || final_text.compare(0, sent_, text_, 0, sent_) != 0) return std::nullopt;
  std::string rest = final_text.substr(sent_);
  sent_ = final_text.size();
  return rest;
}

std::string sse(const json& chunk) {
  return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string sse_done() { return "data: [DONE]\n\n"; }

json stream_chunk(const BatchRequest& req, const StreamIds& ids, int64_t index, const std::string& text, bool first,
                  const std::string* finish_reason, const json* logprobs) {
  const bool chat = req.endpoint == Endpoint::kChat;
  json choice = {{"index", index},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)},
                 {"logprobs", logprobs ? *logprobs : json(nullptr)}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || !finish_reason) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  json chunk = {{"id", ids.id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", ids.created},
                {"model", ids.model},
                {"choices", json::array({choice})}};
  if (req.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json tool_calls_chunk(const BatchRequest& req, const StreamIds& ids, int64_t index, const std::vector<ToolCall>& calls,
                      bool first) {
  json delta = {{"tool_calls", tool_calls_json(calls, true)}};
  if (first) delta["role"] = "assistant";
  json chunk = {{"id", ids.id},
                {"object", "chat.completion.chunk"},
                {"created", ids.created},
                {"model", ids.model},
                {"choices", json::array({{{"index", index}, {"delta", delta}, {"finish_reason", nullptr},
                                          {"logprobs", nullptr}}})}};
  if (req.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json usage_chunk(const BatchRequest& req, const StreamIds& ids, int64_t prompt_tokens, int64_t completion_tokens) {
  const bool chat = req.endpoint == Endpoint::kChat;
  return {{"id", ids.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array()},
          {"usage",
           {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}}}};
}

json error_body(const std::string& message, const std::string& type, const std::string& code, const std::string& param) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

}  // namespace tandem::router
