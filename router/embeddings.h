// Embeddings (/v1/embeddings) on rank 0's side: how a checkpoint pools
// (sentence-transformers' modules.json and 1_Pooling/config.json, or the
// decoder default: the last token, L2-normalised, as Qwen3-Embedding does),
// the vectors finished as the request asks (normalised, `dimensions`
// leading values kept and renormalised) and shaped as OpenAI's response.
// docs/embeddings.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "router/batch_output.h"
#include "router/batch_request.h"
#include "runtime/engine/engine.h"

namespace tandem::router {

// An /v1/embeddings body into r: input (a string, strings, token ids, lists
// of them; at most kMaxEmbeddingInputs), encoding_format, dimensions; model
// and the fields no_effect accepts; any other field refused. Throws
// tandem::Error with the line's message.
void read_embedding_body(const nlohmann::json& body, BatchRequest& r, bool short_form,
                         bool (*no_effect)(const std::string&));

struct EmbeddingPooling {
  runtime::Pooling pooling = runtime::Pooling::kLast;
  bool normalize = true;
  std::string source = "the default for a decoder (last token, normalised)";
  std::string error;  // not empty: the checkpoint's pooling cannot be done (embeddings lines get this error)
};

// Reads model_dir's sentence-transformers configuration, if it has one.
// Throws tandem::Error (one line) on a pooling Tandem does not do (max,
// weighted mean, mean of sqrt length, several modes at once) or a module
// that would change the vectors and is not done (Dense, LayerNorm, ...).
EmbeddingPooling read_pooling(const std::string& model_dir);
// As read_pooling, the error kept in .error instead of thrown (a job that
// asks for no embeddings runs whatever the checkpoint's pooling says).
EmbeddingPooling pooling_or_error(const std::string& model_dir);

// v (one pooled vector): L2-normalised when `normalize`; then, when
// dimensions > 0, its leading `dimensions` values renormalised to length 1
// (Matryoshka). Sums of squares in float64; each value divided once.
std::vector<float> finish_embedding(std::span<const float> v, bool normalize, int64_t dimensions);

// float32 little-endian bytes in standard base64 (OpenAI's encoding_format "base64").
std::string base64_floats(std::span<const float> v);

struct EmbeddingResult {
  std::vector<std::vector<float>> vectors;  // finished, one per input
  int64_t prompt_tokens = 0;
  double e2e_ms = 0;
  int64_t prompt_tokens_computed = 0;
  int worker = 0;
};

// The result of a worker's pooled vectors ([inputs][hidden]).
EmbeddingResult embedding_result_of(const BatchRequest& req, const std::vector<float>& pooled, int64_t hidden,
                                    const EmbeddingPooling& pooling, double e2e_s, int64_t computed, int worker);
// OpenAI's response body: {"object": "list", "data": [...], "model", "usage"}.
nlohmann::json embedding_body(const BatchRequest& req, const EmbeddingResult& res, const OutputContext& ctx);
// A batch output line around it.
std::string format_embedding(const BatchRequest& req, const EmbeddingResult& res, const OutputContext& ctx);

}  // namespace tandem::router
