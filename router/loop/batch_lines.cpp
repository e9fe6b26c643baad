#include "router/loop/batch_lines.h"

#include "common/error.h"

namespace tandem::router {

std::variant<LineRequest, LineError> take_line(PreparedLine& p, const slurm::OutputKey& key, int64_t max_line_bytes,
                                               const EmbeddingPooling& pooling) {
  const std::string at = "line " + std::to_string(p.i + 1) + ": ";
  ParsedLine& parsed = p.parsed;
  // A line past job.max_line_bytes was not kept: its error record carries the custom_id if one came first.
  if (p.line.too_long) {
    auto* bad = std::get_if<LineError>(&parsed);
    parsed = LineError{bad ? bad->custom_id : std::get<BatchRequest>(parsed).custom_id, 400,
                       std::to_string(p.line.length) + " bytes, longer than job.max_line_bytes (" +
                           std::to_string(max_line_bytes) +
                           "); it was skipped unread: shorten it, or raise job.max_line_bytes if a prompt this long "
                           "fits the context"};
  }
  if (auto* e = std::get_if<LineError>(&parsed)) {
    e->message = at + e->message;
    return std::move(*e);
  }
  auto& req = std::get<BatchRequest>(parsed);
  if (key.is_line()) return LineError{req.custom_id, 400, at + "duplicate custom_id '" + req.custom_id + "'; every line needs its own"};
  if (!p.prompt) throw Error(at + "internal: its prompt was not prepared");
  if (auto* e = std::get_if<LineError>(&*p.prompt)) {
    e->message = at + e->message;
    return std::move(*e);
  }
  if (req.endpoint == Endpoint::kEmbeddings && !pooling.error.empty()) return LineError{req.custom_id, 400, at + pooling.error};
  return LineRequest{std::move(req), std::get<std::vector<int32_t>>(std::move(*p.prompt))};
}

service::WireRequest wire_request(const LineRequest& f, uint64_t id, const EmbeddingPooling& pooling, uint64_t job_seed) {
  service::WireRequest w;
  w.id = id;
  if (f.request.endpoint == Endpoint::kEmbeddings) {  // pooled inputs, each a prompt of its own
    w.pooling = static_cast<uint8_t>(pooling.pooling);
    w.inputs = f.request.input_ids;
  } else {
    w.prompt = f.prompt;
  }
  w.params = f.request.params;
  w.rng_key = sampling_key(f.request.seed_given, f.request.params.seed, job_seed, f.request.custom_id);
  return w;
}

Answer answer_line(uint64_t line, LineRequest& f, service::WireResult r, int prefill, const OutputContext& outputs,
                   const EmbeddingPooling& pooling, int64_t hidden) {
  Answer a;
  if (!r.ok) {
    // The engine names the request by its id (the 0-based line index): the line number alone says it.
    const std::string engine_name = "request " + std::to_string(r.id) + ": ";
    const std::string why = r.error.rfind(engine_name, 0) == 0 ? r.error.substr(engine_name.size()) : r.error;
    a.line = format_error({f.request.custom_id, 400, "line " + std::to_string(line + 1) + ": " + why}, outputs);
    return a;
  }
  a.ok = true;
  if (f.request.endpoint == Endpoint::kEmbeddings) {
    const EmbeddingResult res =
        embedding_result_of(f.request, r.embedding, hidden, pooling, r.e2e_s, r.prompt_tokens_computed, r.worker);
    a.prompt_tokens = res.prompt_tokens;
    a.ttft_ms = a.e2e_ms = res.e2e_ms;
    a.line = format_embedding(f.request, res, outputs);
    return a;
  }
  RequestResult res = result_of(std::move(f.prompt), std::move(r), prefill);
  a.prompt_tokens = static_cast<int64_t>(res.prompt_ids.size());
  a.output_tokens = static_cast<int64_t>(res.token_ids.size());
  a.ttft_ms = res.ttft_ms;
  a.itl_ms = res.itl_ms;
  a.e2e_ms = res.e2e_ms;
  a.line = format_result(f.request, res, outputs);
  return a;
}

}  // namespace tandem::router
