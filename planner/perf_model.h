// How long a worker's engine step takes, from the model's shape and the
// worker's hardware: a roofline. A step that runs T tokens (prefill chunks
// and decode tokens together, as Tandem's engine batches them) does
//   flops = 2 * matmul_params * T + attention flops + 2 * hidden * vocab * rows needing logits
//   bytes = weights (read once per step) + KV read by attention + KV written
// and takes max(flops / (peak * mfu), bytes / (bandwidth * mbu)) + a fixed overhead.
//
// A mixture of experts: flops count the experts a token computes (its top k),
// memory every expert, and the bytes a step reads the experts its T tokens
// touch: choosing k of E each, about E (1 - (1 - k/E)^T) of them per layer
// (k at T = 1, nearly all of them by T = 4 E / k). A worker of w GPUs is
// expert-parallel (runtime/cpu/expert_parallel.h): each GPU holds E / w
// experts, and a MoE layer's combine moves each (token, slot) output to its
// token's home GPU and the combined rows back to every GPU.
//
// This one formula is all the simulator knows about batching: a decode-only
// step is memory-bound, so co-batched prefill tokens are nearly free until the
// step turns compute-bound, after which every prefill token slows the decodes
// sharing the step — the trade-off chunked prefill makes (Sarathi-Serve,
// Agrawal et al., OSDI 2024) and disaggregation avoids (DistServe, Zhong et al.,
// OSDI 2024; Splitwise, Patel et al., ISCA 2024). Nothing in it is tuned to a
// policy; mfu, mbu and the overhead come from the hardware profile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "planner/hardware.h"
#include "runtime/engine/step_shape.h"
#include "runtime/model/model_config.h"

namespace tandem::planner {

struct ModelShape {
  double matmul_params = 0;     // parameters of the linear layers (per token: 2 flops each)
  double lm_head_params = 0;
  double weight_bytes = 0;      // everything read once per step
  double kv_bytes_per_token = 0;
  double attn_flops_per_ctx = 0;  // per (query token, context token): 4 * layers * heads * head_dim
  double bytes_per_param = 2;   // bf16: the LM head's, and activations'
  double linear_bytes_per_param = 2;  // the linear layers': 1 for 8-bit weights (a quantized checkpoint, model.dtype fp8/int8)
  double layers = 0, hidden = 0, heads = 0, kv_heads = 0;
  // A worker is a tensor-parallel group of `tp` GPUs (runtime/cpu/tp_group.h's
  // split): each holds 1/tp of the linear layers and of the KV heads (at
  // least one head), the LM head whole; every layer adds two exchanges of the
  // step's hidden states over the GPUs' link (NVLink inside a node).
  int tp = 1;
  // A mixture of experts (0 layers: dense). expert_params: one expert's (its gate, up and down).
  double moe_layers = 0, experts = 0, top_k = 0, expert_params = 0;
  bool expert_parallel = true;  // each GPU of a group holds whole experts; false: every expert split
  // The experts a step of `tokens` rows reads in each MoE layer, on average: E (1 - (1 - k/E)^tokens).
  double experts_touched(double tokens) const;

  // kv_bytes_per_value: 0 means the same as bytes_per_param (the CPU engine keeps KV in fp32: 4). The
  // linear layers count 1 byte a weight where the config says they are 8-bit (quantization_config, or
  // load_as fp8 / int8), bytes_per_param otherwise; the LM head is never quantized.
  static ModelShape from(const runtime::ModelConfig& c, double bytes_per_param = 2, double kv_bytes_per_value = 0);
  // The same model run by groups of `width` GPUs.
  ModelShape at_width(int width) const {
    ModelShape m = *this;
    m.tp = width;
    return m;
  }
  // Why a group of `width` GPUs cannot run it ("" when it can): the heads and KV heads must split (and the
  // experts, with expert parallelism).
  std::string width_problem(int width) const;
  // The share of a token's KV one GPU of the group holds.
  double kv_share() const { return 1.0 / std::max(1.0, std::min(static_cast<double>(tp), kv_heads)); }
};

// One step's work.
using StepLoad = runtime::StepShape;  // one type for the engine's step and the model's

class PerfModel {
 public:
  PerfModel(ModelShape shape, HardwareProfile hw) : m_(shape), hw_(std::move(hw)) {}
  double step_seconds(const StepLoad& s) const;
  // The step's flops and bytes on one GPU of the worker, as step_seconds counts them.
  std::pair<double, double> work(const StepLoad& s) const;
  // A tensor-parallel worker's exchanges in a step of `tokens` rows (0 at width 1).
  double exchange_seconds(double tokens) const;
  // KV of n tokens from one worker to another (a group's GPUs send their shards at once).
  double transfer_seconds(double tokens) const;
  // Tokens of KV a worker can hold after its weights (0 when the weights do not fit).
  double kv_capacity_tokens() const;
  // One GPU's weights (its shard, and the whole LM head).
  double gpu_weight_bytes() const;
  // A worker formed anew at this width (a re-split regrouped its GPUs): each GPU copies its weights in.
  double reload_seconds() const { return gpu_weight_bytes() / hw_.reload_bytes_per_s; }
  const ModelShape& shape() const { return m_; }
  const HardwareProfile& hardware() const { return hw_; }

 private:
  ModelShape m_;
  HardwareProfile hw_;
};

}  // namespace tandem::planner
