#include "runtime/model/quantization.h"

#include <algorithm>
#include <initializer_list>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tandem::runtime {
namespace {

using json = nlohmann::json;

bool one_of(const std::string& key, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return key == n; });
}

// Keys that describe a checkpoint without changing what its weights are.
void check_keys(const json& q, std::initializer_list<const char*> known, const std::string& where,
                const std::string& what) {
  for (const auto& [key, v] : q.items()) {
    if (!one_of(key, known))
      throw Error(where + ": " + what + "." + key + " is not a setting Tandem reads; it cannot tell whether it changes "
                  "the weights (supported: FP8 block and compressed-tensors FP8/INT8 checkpoints, docs/quantization.md)");
  }
}

QuantConfig fp8_block(const json& q, const std::string& where) {
  check_keys(q, {"quant_method", "fmt", "activation_scheme", "weight_block_size", "scale_fmt", "modules_to_not_convert",
                 "ignored_layers"},
             where, "quantization_config");
  if (q.contains("fmt") && q["fmt"] != "e4m3")
    throw Error(where + ": quantization_config.fmt " + q["fmt"].dump() + " is not supported (FP8 weights: e4m3)");
  if (!q.contains("weight_block_size") || !q["weight_block_size"].is_array() || q["weight_block_size"].size() != 2 ||
      !q["weight_block_size"][0].is_number_unsigned() || !q["weight_block_size"][1].is_number_unsigned())
    throw Error(where + ": quantization_config of quant_method \"fp8\" without weight_block_size (per-tensor FP8) is "
                "not supported; FP8 with [rows, cols] block scales is");
  if (q.contains("scale_fmt") && q["scale_fmt"] != "ue8m0" && q["scale_fmt"] != "float32")
    throw Error(where + ": quantization_config.scale_fmt " + q["scale_fmt"].dump() + " is not supported (ue8m0, float32)");
  QuantConfig c;
  c.method = QuantConfig::Method::kFp8Block;
  c.block_rows = q["weight_block_size"][0].get<int64_t>();
  c.block_cols = q["weight_block_size"][1].get<int64_t>();
  if (c.block_rows <= 0 || c.block_cols <= 0) throw Error(where + ": quantization_config.weight_block_size must be positive");
  c.weight = DType::kF8E4M3;
  c.scale_suffix = "weight_scale_inv";
  return c;
}

QuantConfig compressed_tensors(const json& q, const std::string& where) {
  check_keys(q, {"quant_method", "format", "config_groups", "ignore", "kv_cache_scheme", "global_compression_ratio",
                 "quantization_status", "sparsity_config", "transform_config", "version"},
             where, "quantization_config");
  const std::string format = q.value("format", "");
  if (format != "float-quantized" && format != "int-quantized")
    throw Error(where + ": compressed-tensors format \"" + format + "\" is not supported (float-quantized: FP8, "
                "int-quantized: INT8)");
  if (q.contains("kv_cache_scheme") && !q["kv_cache_scheme"].is_null())
    throw Error(where + ": quantization_config.kv_cache_scheme (a quantized KV cache) is not supported; remove it or use a "
                "checkpoint without it");
  if (q.contains("sparsity_config") && !q["sparsity_config"].is_null() && !q["sparsity_config"].empty())
    throw Error(where + ": quantization_config.sparsity_config (sparse weights) is not supported");
  if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].size() != 1)
    throw Error(where + ": compressed-tensors checkpoints with one scheme (config_groups of one group) are supported");
  const json& g = q["config_groups"].begin().value();
  const std::string group = "quantization_config.config_groups." + q["config_groups"].begin().key();
  if (!g.is_object() || !g.contains("weights") || !g["weights"].is_object())
    throw Error(where + ": " + group + " has no weights scheme");
  const json& w = g["weights"];
  const std::string at = group + ".weights";
  if (w.value("num_bits", 0) != 8) throw Error(where + ": " + at + ".num_bits " + w.value("num_bits", json()).dump() + " is not supported (8)");
  if (!w.value("symmetric", true)) throw Error(where + ": " + at + ".symmetric false (zero points) is not supported");
  if (w.value("dynamic", false) == true) throw Error(where + ": " + at + ".dynamic true is not supported");
  const std::string type = w.value("type", "");
  if ((format == "float-quantized") != (type == "float") || (type != "float" && type != "int"))
    throw Error(where + ": " + at + ".type \"" + type + "\" does not match format \"" + format + "\"");
  QuantConfig c;
  c.method = QuantConfig::Method::kCompressedTensors;
  c.weight = type == "float" ? DType::kF8E4M3 : DType::kI8;
  c.scale_suffix = "weight_scale";
  const std::string strategy = w.value("strategy", "");
  if (strategy == "channel") {
    c.block_rows = 1;  // block_cols 0: every column
  } else if (strategy == "tensor") {
    // 0 x 0: one scale for the whole matrix
  } else if (strategy == "block" && w.contains("block_structure") && w["block_structure"].is_array() &&
             w["block_structure"].size() == 2) {
    c.block_rows = w["block_structure"][0].get<int64_t>();
    c.block_cols = w["block_structure"][1].get<int64_t>();
  } else {
    throw Error(where + ": " + at + ".strategy \"" + strategy + "\" is not supported (channel, tensor, block)");
  }
  for (const auto& [key, v] : w.items()) {
    if (one_of(key, {"group_size", "actorder"}) && !v.is_null())
      throw Error(where + ": " + at + "." + key + " (grouped weights) is not supported");
  }
  return c;
}

}  // namespace

std::string QuantConfig::name() const {
  const std::string bits = weight == DType::kI8 ? "int8" : "fp8";
  const std::string grid = block_rows == 0 ? "tensor"
                           : block_cols == 0 ? "channel"
                                             : std::to_string(block_rows) + "x" + std::to_string(block_cols) + " block";
  switch (method) {
    case Method::kNone: return "none";
    case Method::kFp8Block: return "fp8 " + grid;
    case Method::kCompressedTensors: return "compressed-tensors " + bits + " " + grid;
  }
  return "?";
}

QuantConfig parse_quantization(const json& config, const std::string& where) {
  if (!config.contains("quantization_config") || config["quantization_config"].is_null()) return {};
  const json& q = config["quantization_config"];
  if (!q.is_object()) throw Error(where + ": quantization_config must be an object");
  const std::string method = q.value("quant_method", "");
  if (method == "fp8") return fp8_block(q, where);
  if (method == "compressed-tensors") return compressed_tensors(q, where);
  throw Error(where + ": quantization_config.quant_method \"" + method + "\" is not supported (supported: fp8 with block "
              "scales, compressed-tensors FP8/INT8); dequantize the checkpoint to bf16, or see docs/quantization.md");
}

}  // namespace tandem::runtime
