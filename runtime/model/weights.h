// The weights of a model, bound by name and shape-checked against its config.
// Matrices stay in the checkpoint's dtype inside the memory-mapped files (bf16
// stays bf16); small vectors (norms, biases) are copied to float.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "runtime/model/dtype.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem::runtime {

// A row-major [rows][cols] matrix; a linear layer's weight is [out][in].
struct Matrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct LayerWeights {
  std::vector<float> attn_norm;          // [hidden]
  Matrix wq, wk, wv, wo;                 // [heads*hd][hidden], [kv*hd][hidden] x2, [hidden][heads*hd]
  std::vector<float> bq, bk, bv;         // qkv_bias only: [heads*hd], [kv*hd], [kv*hd]
  std::vector<float> bo;                 // o_bias only: [hidden]
  std::vector<float> q_norm, k_norm;     // qk_norm only: [head_dim]
  std::vector<float> mlp_norm;           // [hidden]
  Matrix w_gate, w_up, w_down;           // [inter][hidden] x2, [hidden][inter]
};

struct ModelWeights {
  Matrix embed;                     // [vocab][hidden]
  Matrix lm_head;                   // [vocab][hidden]; the embedding when tied
  std::vector<float> final_norm;    // [hidden]
  std::vector<LayerWeights> layers;
  std::unique_ptr<Checkpoint> checkpoint;  // owns the mappings the matrices point into

  // Throws tandem::Error with one line naming the tensor and file: missing
  // tensor, wrong shape, unsupported dtype, truncated shard.
  static std::unique_ptr<ModelWeights> load(const ModelConfig& config, const std::filesystem::path& model_dir);
};

}  // namespace tandem::runtime
