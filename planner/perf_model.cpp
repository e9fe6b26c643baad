#include "planner/perf_model.h"

#include <algorithm>

namespace tandem::planner {

ModelShape ModelShape::from(const runtime::ModelConfig& c, double bytes_per_param, double kv_bytes_per_value) {
  ModelShape m;
  const double h = static_cast<double>(c.hidden), hd = static_cast<double>(c.head_dim);
  const double q = static_cast<double>(c.heads) * hd, kv = static_cast<double>(c.kv_heads) * hd;
  const double per_layer = h * q + 2 * h * kv + q * h + 3 * h * static_cast<double>(c.intermediate);
  m.matmul_params = per_layer * static_cast<double>(c.layers);
  m.lm_head_params = h * static_cast<double>(c.vocab);
  m.bytes_per_param = bytes_per_param;
  // Read once per step: the linear layers and the LM head. (An untied embedding
  // table is only looked up, a few rows per step.)
  m.weight_bytes = (m.matmul_params + m.lm_head_params) * bytes_per_param;
  m.kv_bytes_per_token = 2 * static_cast<double>(c.layers) * kv * (kv_bytes_per_value > 0 ? kv_bytes_per_value : bytes_per_param);
  m.attn_flops_per_ctx = 4 * static_cast<double>(c.layers) * static_cast<double>(c.heads) * hd;
  return m;
}

std::pair<double, double> PerfModel::work(const StepLoad& s) const {
  const double tokens = s.prefill_tokens + s.decode_seqs;
  const double flops = 2 * m_.matmul_params * tokens + m_.attn_flops_per_ctx * (s.prefill_ctx + s.decode_ctx) +
                       2 * m_.lm_head_params * s.logit_rows;
  const double bytes = m_.weight_bytes + m_.kv_bytes_per_token * (s.decode_ctx + tokens);
  return {flops, bytes};
}

double PerfModel::step_seconds(const StepLoad& s) const {
  if (s.prefill_tokens + s.decode_seqs <= 0) return 0;
  const auto [flops, bytes] = work(s);
  return std::max(flops / (hw_.peak_flops * hw_.mfu), bytes / (hw_.hbm_bytes_per_s * hw_.mbu)) + hw_.step_overhead_s;
}

double PerfModel::transfer_seconds(double tokens) const {
  return hw_.link_latency_s + tokens * m_.kv_bytes_per_token / hw_.link_bytes_per_s;
}

double PerfModel::kv_capacity_tokens() const {
  const double free = (hw_.hbm_bytes - m_.weight_bytes) * hw_.kv_memory_fraction;
  return free > 0 ? free / m_.kv_bytes_per_token : 0;
}

}  // namespace tandem::planner
