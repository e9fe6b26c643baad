// `tandem quantize`: writes a bf16/f16/f32 checkpoint's linear layers as 8-bit
// weights in a public layout that Tandem, vLLM and transformers read
// (quantization.h describes both):
//
//   fp8-block:    quant_method "fp8", e4m3 weights, one f32 `weight_scale_inv`
//                 per 128 x 128 block; scale = the block's largest |w| / 448,
//                 q = nearest e4m3 to w / scale (ties to even).
//   int8-channel: compressed-tensors "int-quantized", channel strategy, one f32
//                 `weight_scale` per output row; scale = the row's largest
//                 |w| / 127, q = w / scale rounded to the nearest integer (ties
//                 to even), clamped to +-127.
//
// What is quantized: the attention and MLP projections (`*_proj.weight`) and
// Mixtral's expert matrices (`w1`, `w2`, `w3`). The embeddings, the LM head,
// norms, biases and MoE routers stay as they are, byte for byte. A block or
// row of zeros gets scale 1. Shards keep their names; scales go in their
// weight's shard; the index is rewritten. Other files (tokenizer, generation
// config, chat template) are copied. Memory is bounded by one tensor: each is
// read, quantized and written before the next.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "runtime/model/dtype.h"
#include "runtime/model/safetensors.h"

namespace tandem::runtime {

struct QuantizeOptions {
  std::filesystem::path in_dir, out_dir;
  std::string scheme;  // "fp8-block" | "int8-channel"
};

// The error a quantized tensor carries, W' = q * scale against the original W:
// max |W' - W| / max |W| and ||W' - W|| / ||W|| (0 for an all-zero tensor).
struct TensorQuantError {
  std::string name;
  int64_t rows = 0, cols = 0;
  double max_rel = 0, rms_rel = 0;
};

struct QuantizeSummary {
  int64_t quantized = 0, kept = 0;          // tensors
  uint64_t bytes_in = 0, bytes_out = 0;     // tensor data
  TensorQuantError worst_max, worst_rms;    // the tensors with the largest errors
};

// Throws tandem::Error (one line) on a bad or already quantized input, an
// output directory that is not new or empty, a weight that is not finite.
QuantizeSummary quantize_checkpoint(const QuantizeOptions& options,
                                    const std::function<void(const TensorQuantError&)>& on_tensor = {});

// Whether `tandem quantize` quantizes this tensor (by name, for a 2-D weight).
bool quantizable_weight(const std::string& name);

// One matrix quantized as `tandem quantize` writes it (also model.dtype =
// "fp8" | "int8" as a checkpoint loads): codes [rows][cols], scales
// [ceil(rows / block_rows)][scale_cols] f32, and the error introduced.
struct QuantizedWeight {
  std::vector<uint8_t> q;
  std::vector<float> scales;
  DType dtype = DType::kF8E4M3;
  int64_t block_rows = 0, block_cols = 0, scale_cols = 0;
  double max_rel = 0, rms_rel = 0;
};
// Throws tandem::Error when a weight is not finite or the scheme is unknown.
QuantizedWeight quantize_weight(const TensorView& t, const std::string& scheme);

}  // namespace tandem::runtime
