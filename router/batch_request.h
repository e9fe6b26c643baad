// One line of an OpenAI-Batch input file, parsed and checked.
//
// Accepted forms (as `vllm run-batch` reads them, plus a short form):
//   {"custom_id", "method": "POST", "url": "/v1/completions" | "/v1/chat/completions", "body": {...}}
//   {"custom_id", "prompt" | "messages" | "prompt_token_ids", "max_tokens", ...}
// Every sampling option of the engine is accepted by its OpenAI (or vLLM)
// name. `body.model` is echoed back, never checked: a job serves one model.
// A bad line yields a LineError (HTTP-style status 400 and a message that
// says what is wrong and how to fix it), never an exception.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/engine/sampling.h"
#include "runtime/tokenizer/chat_template.h"

namespace tandem::router {

struct ToolRequest;   // router/tool_calls.h
struct BodyDefaults;  // router/body_defaults.h

enum class Endpoint { kCompletions, kChat, kEmbeddings };

// The most inputs one embeddings request may carry (OpenAI's limit).
constexpr std::size_t kMaxEmbeddingInputs = 2048;

struct BatchRequest {
  std::string custom_id;
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // echoed in the response; empty when the line names none
  // Exactly one of these carries the prompt.
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int32_t>> prompt_ids;
  std::optional<std::vector<runtime::ChatMessage>> messages;
  std::optional<bool> enable_thinking;  // chat_template_kwargs.enable_thinking (Qwen3's switch)
  std::optional<std::string> date_string;  // chat_template_kwargs.date_string (Llama 3.1+'s "Today Date")
  std::shared_ptr<const ToolRequest> tools;  // chat: tools, tool_choice, parallel_tool_calls; null: none
  runtime::ToolFormat tool_format = runtime::ToolFormat::kNone;  // how the model writes calls (set by build_prompt)
  int32_t tool_marker = -1;  // Mistral: the [TOOL_CALLS] token id (set by build_prompt)
  runtime::SamplingParams params;
  bool max_tokens_given = false;  // chat without max_tokens: up to the context's end
  bool echo = false;              // completions: the prompt precedes the text in the output
  bool seed_given = false;
  bool chat_logprobs = false;     // chat: "logprobs": true
  bool prompt_logprobs_asked = false;  // completions: prompt_logprobs given (echo with logprobs sets the params alone)
  // Embeddings (/v1/embeddings): the inputs, as texts or as token ids (one
  // of the two); after build_prompt, input_ids holds every input's ids.
  std::optional<std::vector<std::string>> input_texts;
  std::vector<std::vector<int32_t>> input_ids;
  bool base64 = false;      // encoding_format "base64": float32 little-endian bytes
  int64_t dimensions = 0;   // > 0: keep this many leading dimensions, renormalised
  // HTTP only (a batch line refuses n > 1 and ignores stream):
  int64_t n = 1;                  // choices, each sampled on its own
  bool stream = false;            // Server-Sent Events
  bool include_usage = false;     // stream_options.include_usage
};

struct LineError {
  std::string custom_id;  // as far as it could be read; may be empty
  int status = 400;
  std::string message;
};

using ParsedLine = std::variant<BatchRequest, LineError>;

// default_max_tokens: for completions without max_tokens (OpenAI's default is 16).
// defaults: the job's fields merged under the line's body (body_defaults.h); null: none.
ParsedLine parse_batch_line(std::string_view line, int64_t default_max_tokens = 16,
                            const BodyDefaults* defaults = nullptr);

// The body of an HTTP request to `endpoint` (tandem serve): the same fields as
// a batch line's body, plus n (up to kMaxChoices), stream and
// stream_options.include_usage. custom_id is left empty for the caller.
constexpr int64_t kMaxChoices = 16;
ParsedLine parse_request_body(Endpoint endpoint, std::string_view body, int64_t default_max_tokens = 16);

// The sampling key of a request: its own seed when it gave one (OpenAI's
// meaning: same seed, same output), else the job's seed with its custom_id.
uint64_t sampling_key(bool seed_given, uint64_t seed, uint64_t job_seed, const std::string& custom_id);

}  // namespace tandem::router
