// One batch line's way through a front end, shared by `tandem run`'s batch
// file (batch_frontend.h) and serve's Batches API (launcher/serve): what a
// prepared input line becomes (a request to place, or the error record to
// write), its wire request, and the output line its result becomes.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "router/batch_output.h"
#include "router/batch_request.h"
#include "router/embeddings.h"
#include "router/loop/batch_input.h"
#include "runtime/service/protocol.h"
#include "slurm/resumable_output.h"

namespace tandem::router {

struct LineRequest {
  BatchRequest request;
  std::vector<int32_t> prompt;
};

// A prepared line that carries a request (not blank, not done before), with
// its settled key: the request, or its error record's error (a line too long,
// unparsable, a custom_id an earlier line has, a prompt that cannot be
// built, an embedding the checkpoint cannot pool). Errors name the line.
std::variant<LineRequest, LineError> take_line(PreparedLine& p, const slurm::OutputKey& key, int64_t max_line_bytes,
                                               const EmbeddingPooling& pooling);

// The wire request for line `id`'s request (an embedding's inputs, or its prompt).
service::WireRequest wire_request(const LineRequest& f, uint64_t id, const EmbeddingPooling& pooling, uint64_t job_seed);

// A finished request's output line and its figures.
struct Answer {
  std::string line;
  bool ok = false;  // false: an error record
  int64_t prompt_tokens = 0, output_tokens = 0;
  double ttft_ms = 0, itl_ms = 0, e2e_ms = 0;
};
// line: the 0-based input line; prefill: the rank that prefilled it remotely (-1: none).
Answer answer_line(uint64_t line, LineRequest& f, service::WireResult r, int prefill, const OutputContext& outputs,
                   const EmbeddingPooling& pooling, int64_t hidden);

}  // namespace tandem::router
