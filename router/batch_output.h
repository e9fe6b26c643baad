// OpenAI-Batch output lines: one per input line, success or error.
//
//   {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null,
//    "tandem": {"token_ids", "ttft_ms", "itl_ms", "e2e_ms", "prompt_tokens_computed", "worker"}}
// The body is a `text_completion` or `chat.completion` object with `usage`.
// The `tandem` extension carries the token ids and per-request timings. Ids
// are derived from the custom_id (and `created` from the job's start), so a
// rerun writes the same ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "router/batch_request.h"
#include "router/tool_calls.h"
#include "runtime/service/protocol.h"
#include "runtime/engine/sampling.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem::router {

struct RequestResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> token_ids;
  std::string text;
  std::string finish_reason;  // stop | length | abort
  std::vector<runtime::PositionLogprobs> logprobs;
  std::vector<runtime::PositionLogprobs> prompt_logprobs;
  double ttft_ms = 0, itl_ms = 0, e2e_ms = 0;
  int64_t prompt_tokens_computed = 0;  // prompt tokens this request's ranks computed (not cache hits)
  int worker = 0;                      // decode rank
  int prefill_worker = -1;             // rank that prefilled it remotely; -1: prefilled on `worker`
  int64_t kv_blocks_moved = 0;         // prompt KV blocks that crossed the transport
};

// A worker's result as the output formats take it, for the batch file and
// HTTP alike (prefill_worker: the rank that prefilled it remotely, or -1).
RequestResult result_of(std::vector<int32_t> prompt, service::WireResult r, int prefill_worker = -1);

struct OutputContext {
  std::string served_name;
  int64_t created = 0;  // unix seconds, the job's start
  const runtime::Tokenizer* tokenizer = nullptr;  // for logprob token strings and echo
};

std::string format_result(const BatchRequest& req, const RequestResult& res, const OutputContext& ctx);

// The response body alone (a text_completion or chat.completion object),
// one choice per result, for the HTTP shim; usage sums every choice's tokens.
nlohmann::json response_body(const BatchRequest& req, const std::vector<RequestResult>& choices,
                             const OutputContext& ctx, const std::string& id);
// The id format_result gives the body of a batch line: prefix + a hash of key.
std::string derived_id(const std::string& prefix, const std::string& key);
std::string format_error(const LineError& err, const OutputContext& ctx);

// A chat answer's tool calls, when the request gave tools (tool_choice not
// "none") and the text is content followed by calls; `choice` (its index)
// keeps the calls' ids apart between choices.
// tokens and tokenizer: the answer's ids, to put back the [TOOL_CALLS] token a
// decode leaves out (Mistral); text alone serves the other formats.
std::optional<ToolAnswer> tool_answer(const BatchRequest& req, const std::string& text, std::span<const int32_t> tokens,
                                      const runtime::Tokenizer* tokenizer, std::size_t choice);
// message.tool_calls (with_index: a stream's delta.tool_calls, each with its index).
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);

}  // namespace tandem::router
