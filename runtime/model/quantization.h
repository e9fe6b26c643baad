// Quantized checkpoints as they ship (config.json's quantization_config):
//
//   FP8 block ("quant_method": "fp8", "fmt": "e4m3", "weight_block_size":
//   [128, 128], DeepSeek-V3/R1 and Qwen's -FP8 builds): a quantized linear
//   layer's `weight` is F8_E4M3 [out, in] and `weight_scale_inv` holds one
//   f32 or bf16 scale per 128 x 128 block ([ceil(out/128), ceil(in/128)]);
//   W = q * scale_inv (it multiplies, whatever its name says).
//
//   compressed-tensors ("quant_method": "compressed-tensors", format
//   "float-quantized" or "int-quantized", llm-compressor's FP8 and INT8):
//   `weight` F8_E4M3 or I8 and `weight_scale` per output channel ([out, 1])
//   or per tensor ([1]); W = q * weight_scale. Symmetric only.
//
// Tensors without a scale (embeddings, norms, router gates, the LM head, the
// modules a checkpoint leaves unquantized) load as they are. Weights are
// dequantized when the model loads, each to the f32 value q * scale (one
// rounding, as torch's q.float() * scale computes it), and the engine runs
// its f32 arithmetic on them. Activations are not quantized, whatever the
// checkpoint's activation scheme says (weight-only: the more accurate
// reading). Any other method or setting stops the load with one line naming it.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "runtime/model/dtype.h"

namespace tandem::runtime {

struct QuantConfig {
  enum class Method { kNone, kFp8Block, kCompressedTensors };
  Method method = Method::kNone;
  // The scale grid: one scale per block_rows x block_cols weights (fp8 block: 128 x 128; a channel: 1 x all
  // columns; a tensor: all x all, written 0 x 0 here and read as the whole matrix).
  int64_t block_rows = 0, block_cols = 0;
  DType weight = DType::kF8E4M3;  // what quantized weights are stored as
  std::string scale_suffix;       // after the weight's name without "weight": "weight_scale_inv" or "weight_scale"

  bool any() const { return method != Method::kNone; }
  std::string name() const;  // "fp8 block 128x128", "compressed-tensors int8 channel", ...
};

// config.json's quantization_config (absent: kNone). Throws tandem::Error
// with one line naming what is not supported: another method (AWQ, GPTQ,
// bitsandbytes, MXFP4, NVFP4), FP8 without block scales, an FP8 format
// other than e4m3, asymmetric or grouped compressed-tensors schemes, more
// than one scheme, another bit width.
QuantConfig parse_quantization(const nlohmann::json& config, const std::string& where);

}  // namespace tandem::runtime
