// Streaming responses of the HTTP shim as OpenAI's clients read them:
// Server-Sent Events carrying `text_completion` or `chat.completion.chunk`
// objects, then `data: [DONE]`.
//
// Text is released conservatively so that the streamed text always equals the
// text of the same request without streaming: the worker's final text is
// authoritative (it is cut before a stop string), so while tokens stream,
// the last (longest stop string - 1) bytes are held back — a stop string
// cannot begin before them, since it was not yet complete — and the rest is
// sent when the request finishes. An answer that may hold tool calls is
// sent as content only up to where a call begins (or may begin); its calls
// go in one delta.tool_calls chunk when it finishes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "router/batch_request.h"
#include "router/tool_calls.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem::router {

class StreamText {
 public:
  // tools: the format of the answer's tool calls (kNone: the answer is all
  // content); marker: Mistral's [TOOL_CALLS] token, a special token the
  // decode leaves out, put back into the text where it comes.
  StreamText(const runtime::Tokenizer* tokenizer, const std::vector<std::string>& stop,
             runtime::ToolFormat tools = runtime::ToolFormat::kNone, int32_t marker = -1);
  // New tokens of an unfinished request: the text that may be sent now.
  std::string push(const std::vector<int32_t>& tokens);
  // The request finished with final_text: the rest to send. Returns nullopt
  // when what was sent is not a prefix of final_text (a bug: logged by the caller).
  std::optional<std::string> finish(const std::string& final_text);

 private:
  std::optional<runtime::StreamDecoder> decoder_;
  runtime::ToolFormat tools_;
  int32_t marker_ = -1;
  std::string marker_text_;
  std::size_t hold_ = 0;  // bytes held back
  std::string text_;      // decoded so far
  std::size_t sent_ = 0;  // bytes of text_ released
};

struct StreamIds {
  std::string id;      // cmpl-… / chatcmpl-…
  std::string model;
  int64_t created = 0;
};

// One event: "data: {json}\n\n".
std::string sse(const nlohmann::json& chunk);
std::string sse_done();  // "data: [DONE]\n\n"

// A chunk with text (chat: the assistant's content; role on the first chunk of
// a choice) and, on the last chunk of a choice, its finish_reason and logprobs.
nlohmann::json stream_chunk(const BatchRequest& req, const StreamIds& ids, int64_t index, const std::string& text,
                            bool first, const std::string* finish_reason, const nlohmann::json* logprobs);
// A choice's tool calls, in one chunk (delta.tool_calls, each with its index).
nlohmann::json tool_calls_chunk(const BatchRequest& req, const StreamIds& ids, int64_t index,
                                const std::vector<ToolCall>& calls, bool first);
// The final usage chunk (stream_options.include_usage): no choices.
nlohmann::json usage_chunk(const BatchRequest& req, const StreamIds& ids, int64_t prompt_tokens,
                           int64_t completion_tokens);
// OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& code,
                          const std::string& param = "");

}  // namespace tandem::router
