#include "planner/perf_model.h"

#include <algorithm>
#include <cmath>

namespace tandem::planner {

ModelShape ModelShape::from(const runtime::ModelConfig& c, double bytes_per_param, double kv_bytes_per_value) {
  ModelShape m;
  const double h = static_cast<double>(c.hidden), hd = static_cast<double>(c.head_dim);
  const double q = static_cast<double>(c.heads) * hd, kv = static_cast<double>(c.kv_heads) * hd;
  // Per layer: attention, and the MLP a token computes (a mixture of experts': its router and top-k
  // experts) beside the MLP weights there are (every expert).
  double active = 0, stored = 0;
  for (int64_t l = 0; l < c.layers; ++l) {
    const double attn = h * q + 2 * h * kv + q * h;
    if (c.moe.at(l)) {
      const double expert = 3 * h * static_cast<double>(c.moe.intermediate), router = h * static_cast<double>(c.moe.experts);
      active += attn + router + static_cast<double>(c.moe.top_k) * expert;
      stored += attn + router + static_cast<double>(c.moe.experts) * expert;
    } else {
      active += attn + 3 * h * static_cast<double>(c.intermediate);
      stored += attn + 3 * h * static_cast<double>(c.intermediate);
    }
  }
  m.matmul_params = active;
  m.lm_head_params = h * static_cast<double>(c.vocab);
  m.bytes_per_param = bytes_per_param;
  const bool eight_bit = c.quant.any() || c.load_as == "fp8" || c.load_as == "int8";
  m.linear_bytes_per_param = eight_bit ? 1.0 : bytes_per_param;
  // Read once per step: the linear layers and the LM head (a MoE's every
  // expert: an upper bound, as a step reads only the experts its tokens
  // chose). An untied embedding table is only looked up, a few rows per step.
  m.weight_bytes = stored * m.linear_bytes_per_param + m.lm_head_params * bytes_per_param;
  m.kv_bytes_per_token = 2 * static_cast<double>(c.layers) * kv * (kv_bytes_per_value > 0 ? kv_bytes_per_value : bytes_per_param);
  m.attn_flops_per_ctx = 4 * static_cast<double>(c.layers) * static_cast<double>(c.heads) * hd;
  m.layers = static_cast<double>(c.layers);
  m.hidden = h;
  m.heads = static_cast<double>(c.heads);
  m.kv_heads = static_cast<double>(c.kv_heads);
  for (int64_t l = 0; l < c.layers; ++l) m.moe_layers += c.moe.at(l) ? 1 : 0;
  m.experts = static_cast<double>(c.moe.experts);
  m.top_k = static_cast<double>(c.moe.top_k);
  m.expert_params = 3 * h * static_cast<double>(c.moe.intermediate);
  return m;
}

double ModelShape::experts_touched(double tokens) const {
  if (experts <= 0 || tokens <= 0) return 0;
  return experts * (1 - std::pow(1 - top_k / experts, tokens));
}

std::string ModelShape::width_problem(int width) const {
  const auto w = static_cast<int64_t>(width), h = static_cast<int64_t>(heads), kv = static_cast<int64_t>(kv_heads);
  if (w != 1 && w != 2 && w != 4 && w != 8) return "a tensor-parallel width is 1, 2, 4 or 8, not " + std::to_string(w);
  if (h % w != 0) return "a width of " + std::to_string(w) + " does not divide the model's " + std::to_string(h) + " attention heads";
  if (kv % w != 0 && w % kv != 0)
    return "a width of " + std::to_string(w) + " neither divides the model's " + std::to_string(kv) +
           " KV heads nor is a multiple of them";
  if (moe_layers > 0 && expert_parallel && static_cast<int64_t>(experts) % w != 0)
    return "a width of " + std::to_string(w) + " does not divide the model's " + std::to_string(static_cast<int64_t>(experts)) +
           " experts (expert parallelism gives each GPU whole experts)";
  return "";
}

std::pair<double, double> PerfModel::work(const StepLoad& s) const {
  const double tokens = s.prefill_tokens + s.decode_seqs, tp = m_.tp;
  // The layers and attention split over the group; the LM head is whole on every GPU.
  const double flops = (2 * m_.matmul_params * tokens + m_.attn_flops_per_ctx * (s.prefill_ctx + s.decode_ctx)) / tp +
                       2 * m_.lm_head_params * s.logit_rows;
  const double lm_head_bytes = m_.lm_head_params * m_.bytes_per_param;
  // A MoE step reads only the experts its tokens chose, spread over the group's GPUs.
  const double untouched =
      m_.moe_layers * (m_.experts - m_.experts_touched(tokens)) * m_.expert_params * m_.linear_bytes_per_param;
  const double bytes = (m_.weight_bytes - lm_head_bytes - untouched) / tp + lm_head_bytes +
                       m_.kv_bytes_per_token * m_.kv_share() * (s.decode_ctx + tokens);
  return {flops, bytes};
}

// Two per layer (after o_proj and after down_proj), each of the step's rows
// of hidden states in the activations' type, as a ring all-reduce moves them
// (2 (tp - 1) / tp of the bytes through each GPU's link), plus the link's latency.
//
// A MoE layer's second exchange is the experts' combine instead: with expert
// parallelism each GPU receives its home tokens' k outputs from the other
// GPUs (T k H (tp - 1) / tp^2) and every other GPU's combined rows
// (T H (tp - 1) / tp), in two collectives; with experts split, an all-reduce
// of every (token, slot) output (k times the dense exchange).
double PerfModel::exchange_seconds(double tokens) const {
  if (m_.tp <= 1 || tokens <= 0) return 0;
  const double tp = m_.tp, row = tokens * m_.hidden * m_.bytes_per_param;
  const double dense = row * 2 * (tp - 1) / tp;
  const double one = hw_.link_latency_s + dense / hw_.link_bytes_per_s;
  const double combine = m_.expert_parallel
                             ? 2 * hw_.link_latency_s + (row * m_.top_k * (tp - 1) / (tp * tp) + row * (tp - 1) / tp) /
                                                            hw_.link_bytes_per_s
                             : hw_.link_latency_s + m_.top_k * dense / hw_.link_bytes_per_s;
  return (2 * m_.layers - m_.moe_layers) * one + m_.moe_layers * combine;
}

double PerfModel::step_seconds(const StepLoad& s) const {
  const double tokens = s.prefill_tokens + s.decode_seqs;
  if (tokens <= 0) return 0;
  const auto [flops, bytes] = work(s);
  return std::max(flops / (hw_.peak_flops * hw_.mfu), bytes / (hw_.hbm_bytes_per_s * hw_.mbu)) + hw_.step_overhead_s +
         exchange_seconds(tokens);
}

double PerfModel::transfer_seconds(double tokens) const {
  return hw_.link_latency_s + tokens * m_.kv_bytes_per_token / (hw_.link_bytes_per_s * m_.tp);
}

double PerfModel::gpu_weight_bytes() const {
  const double lm_head_bytes = m_.lm_head_params * m_.bytes_per_param;
  return (m_.weight_bytes - lm_head_bytes) / m_.tp + lm_head_bytes;
}

double PerfModel::kv_capacity_tokens() const {
  const double free = (hw_.hbm_bytes - gpu_weight_bytes()) * hw_.kv_memory_fraction;
  return free > 0 ? free / (m_.kv_bytes_per_token * m_.kv_share()) : 0;
}

}  // namespace tandem::planner
