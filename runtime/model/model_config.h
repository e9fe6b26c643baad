// config.json of a Hugging Face decoder-only checkpoint, as Tandem needs it.
// Supported architectures: LlamaForCausalLM, MistralForCausalLM (same graph),
// Qwen2ForCausalLM (q/k/v bias), Qwen3ForCausalLM (per-head q/k RMSNorm),
// and the mixtures of experts Qwen3MoeForCausalLM (Qwen3's attention, MoE
// layers of `experts` SwiGLU experts, some layers dense) and
// MixtralForCausalLM (Mistral's attention, every layer MoE).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/model/dtype.h"
#include "runtime/model/quantization.h"

namespace tandem::runtime {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 } type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

// A mixture-of-experts model's MLP: per token a router (softmax over the
// experts in float32) picks the top_k experts (ties to the lower id), whose
// outputs are summed weighted by their probabilities (renormalised to sum
// to one where norm_topk says so).
struct MoeConfig {
  int64_t experts = 0;       // num_experts (Qwen3-MoE), num_local_experts (Mixtral); 0: a dense model
  int64_t top_k = 0;         // num_experts_per_tok
  int64_t intermediate = 0;  // an expert's width: moe_intermediate_size (Qwen3-MoE), intermediate_size (Mixtral)
  bool norm_topk = true;     // norm_topk_prob (Qwen3-MoE); Mixtral always renormalises
  std::vector<bool> sparse;  // per layer: MoE, else the dense MLP of ModelConfig::intermediate
  bool any() const { return experts > 0; }
  bool at(int64_t layer) const { return experts > 0 && sparse[static_cast<std::size_t>(layer)]; }
};

struct ModelConfig {
  std::string architecture;  // as in config.json, e.g. "Qwen3ForCausalLM"
  int64_t hidden = 0;        // hidden_size
  int64_t intermediate = 0;  // intermediate_size
  int64_t layers = 0;        // num_hidden_layers
  int64_t heads = 0;         // num_attention_heads
  int64_t kv_heads = 0;      // num_key_value_heads
  int64_t head_dim = 0;      // explicit head_dim, else hidden / heads
  int64_t vocab = 0;         // vocab_size
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_embeddings = false;
  bool qkv_bias = false;  // Qwen2, or attention_bias: true
  bool o_bias = false;    // attention_bias: true (Llama family; Qwen2 has none on o_proj)
  int64_t sliding_window = 0;  // Mistral: attend to the last N positions only; 0: everything
  bool qk_norm = false;   // Qwen3
  DType dtype = DType::kBF16;  // torch_dtype
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;
  MoeConfig moe;
  QuantConfig quant;  // quantization_config (quantization.h); kNone for bf16/f16/f32 checkpoints
  // How the matrices are held once loaded (tandem run's model.dtype; not in config.json): "auto" as
  // stored; "f32" | "bf16" | "f16" converted (rounded to nearest even); "fp8" | "int8" the linear
  // layers quantized as `tandem quantize --scheme fp8-block | int8-channel` would (quantize.h).
  std::string load_as = "auto";
  // The CPU backend's product arithmetic (tandem run's model.cpu_matmul: "f32" | "bf16" | "bf16-amx" | "int8"; not in
  // config.json):
  // it changes the bits of the KV computed, so the KV store's fingerprint includes it.
  std::string cpu_matmul = "f32";
  // The CUDA backend's long products of FP8 128x128-block weights (tandem run's model.gpu_matmul: "auto" |
  // "fp8"; not in config.json): "fp8" quantizes their activations for Hopper's FP8 tensor cores.
  std::string gpu_matmul = "auto";

  // Reads DIR/config.json; throws tandem::Error with one line naming the file
  // and the problem (missing field, unsupported architecture or dtype).
  static ModelConfig load(const std::filesystem::path& model_dir);
  static ModelConfig parse(const nlohmann::json& j, const std::string& where);
  nlohmann::json to_json() const;  // config.json as Hugging Face writes it
};

}  // namespace tandem::runtime
