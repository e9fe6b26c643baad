// Deterministic random-weight checkpoints in Hugging Face format: Tandem's
// test, demo and benchmark models (no trained weights can be downloaded on
// the machines we build on). Same options and seed, same bytes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "runtime/model/model_config.h"

namespace tandem::runtime {

struct MakeModelOptions {
  std::string arch = "qwen3";     // llama | qwen2 | qwen3 | qwen3_moe | mixtral
  std::string preset = "tiny";    // tiny | small | bench (bench: Qwen3-0.6B's shape)
  std::filesystem::path tokenizer_dir;  // tokenizer.json (+ tokenizer_config.json) to copy; sets the vocabulary
  uint64_t seed = 0;
  std::filesystem::path out_dir;
  // Overrides of the preset; unset keeps it.
  std::optional<int64_t> hidden, layers, heads, kv_heads, head_dim, intermediate, max_position;
  std::optional<bool> tie_embeddings;
  std::string dtype = "bf16";     // f32 | bf16 | f16
  std::string rope_scaling;       // "", "linear:FACTOR" or "llama3:FACTOR"
  int64_t shards = 1;             // >1 writes model-0000i-of-0000n.safetensors + index
  // Mixtures of experts (qwen3_moe, mixtral); unset keeps the preset's.
  std::optional<int64_t> experts, experts_per_token, moe_intermediate;
  // qwen3_moe: the layers with a dense MLP (mlp_only_layers); unset: layer 0 when there are two or more.
  std::optional<std::vector<int64_t>> dense_layers;
};

// The config the options describe (validated). Throws tandem::Error.
ModelConfig make_model_config(const MakeModelOptions& options, int64_t tokenizer_vocab);

// Writes config.json, the safetensors file(s) and the tokenizer files into
// out_dir (created). Returns the config written. Throws tandem::Error.
ModelConfig make_model(const MakeModelOptions& options);

}  // namespace tandem::runtime
