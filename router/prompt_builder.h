// From a parsed request to the prompt's token ids, on rank 0: tokenize text
// (with the model's special tokens, as vLLM does for completions), render and
// tokenize chats with the chat template, or take the ids as given; then check
// the prompt against the context and settle max_tokens.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "router/batch_request.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem::router {

struct PromptContext {
  const runtime::Tokenizer* tokenizer = nullptr;
  const runtime::ChatTemplate* chat = nullptr;  // null: chat requests are refused (no template)
  std::string chat_error;                        // why there is no template, for the refusal
  int64_t max_model_len = 0;
  int32_t vocab_size = 0;
  int64_t hidden = 0;  // the embeddings' width (0: not checked)
};

// On success the token ids, and req.params.max_tokens fitted to the context.
std::variant<std::vector<int32_t>, LineError> build_prompt(BatchRequest& req, const PromptContext& ctx);

}  // namespace tandem::router
