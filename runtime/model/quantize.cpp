#include "runtime/model/quantize.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/model/dtype.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr int64_t kFp8Block = 128;
constexpr float kFp8Max = 448.0f;
constexpr float kInt8Max = 127.0f;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

struct Scheme {
  bool fp8 = true;
  DType weight = DType::kF8E4M3;
  std::string scale_suffix;  // replaces "weight"
  int64_t block_rows = 0, block_cols = 0;  // 0 cols: the whole row

  int64_t scale_rows(int64_t rows) const { return (rows + block_rows - 1) / block_rows; }
  int64_t scale_cols(int64_t cols) const { return block_cols == 0 ? 1 : (cols + block_cols - 1) / block_cols; }
};

Scheme scheme_of(const std::string& name) {
  Scheme s;
  if (name == "fp8-block") {
    s.scale_suffix = "weight_scale_inv";
    s.block_rows = s.block_cols = kFp8Block;
  } else if (name == "int8-channel") {
    s.fp8 = false;
    s.weight = DType::kI8;
    s.scale_suffix = "weight_scale";
    s.block_rows = 1;
  } else {
    throw Error("quantize: --scheme must be fp8-block or int8-channel, got '" + name + "'");
  }
  return s;
}

// config.json's quantization_config for the scheme, as the public tools write it.
json quantization_config(const Scheme& s) {
  if (s.fp8)
    return {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
            {"weight_block_size", {kFp8Block, kFp8Block}}};
  // llm-compressor's W8A8 INT8 layout (weights per channel, activations per token at run time, as vLLM reads
  // it); Tandem itself runs it weight-only (docs/quantization.md).
  json weights = {{"num_bits", 8},        {"type", "int"},         {"symmetric", true},   {"strategy", "channel"},
                  {"dynamic", false},     {"group_size", nullptr}, {"block_structure", nullptr},
                  {"actorder", nullptr},  {"observer", "minmax"},  {"observer_kwargs", json::object()}};
  json activations = {{"num_bits", 8},       {"type", "int"},          {"symmetric", true}, {"strategy", "token"},
                      {"dynamic", true},     {"group_size", nullptr},  {"block_structure", nullptr},
                      {"actorder", nullptr}, {"observer", nullptr},    {"observer_kwargs", json::object()}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "int-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", activations},
              {"output_activations", nullptr}, {"format", "int-quantized"}}}}},
          {"ignore", {"lm_head", "re:.*mlp\\.gate$", "re:.*block_sparse_moe\\.gate$"}},
          {"kv_cache_scheme", nullptr},
          {"global_compression_ratio", nullptr}};
}

using Quantized = QuantizedWeight;

Quantized quantize_matrix(const TensorView& t, const Scheme& s) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const int64_t br = s.block_rows, bc = s.block_cols == 0 ? cols : s.block_cols;
  const int64_t sr = s.scale_rows(rows), sc = s.scale_cols(cols);
  std::vector<float> w(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < w.size(); ++i) {
    w[i] = load_as_f32(t.data, t.dtype, i);
    if (!std::isfinite(w[i]))
      throw Error(t.file + ": tensor '" + t.name + "' holds " + (std::isnan(w[i]) ? "a NaN" : "an infinity") + " at row " +
                  std::to_string(static_cast<int64_t>(i) / cols) + ", column " + std::to_string(static_cast<int64_t>(i) % cols) +
                  "; it cannot be quantized");
  }
  Quantized out;
  out.q.resize(w.size());
  out.scales.resize(static_cast<std::size_t>(sr * sc));
  double err2 = 0, norm2 = 0, max_err = 0, max_w = 0;
  for (int64_t bi = 0; bi < sr; ++bi) {
    for (int64_t bj = 0; bj < sc; ++bj) {
      const int64_t r0 = bi * br, r1 = std::min(rows, r0 + br), c0 = bj * bc, c1 = std::min(cols, c0 + bc);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[static_cast<std::size_t>(r * cols + c)]));
      const float scale = amax == 0 ? 1.0f : amax / (s.fp8 ? kFp8Max : kInt8Max);
      out.scales[static_cast<std::size_t>(bi * sc + bj)] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const auto i = static_cast<std::size_t>(r * cols + c);
          const float x = w[i] / scale;
          float back;
          if (s.fp8) {
            out.q[i] = f32_to_f8e4m3(x);
            back = f8e4m3_to_f32(out.q[i]) * scale;
          } else {
            const float v = std::clamp(std::nearbyint(x), -kInt8Max, kInt8Max);  // ties to even
            out.q[i] = static_cast<uint8_t>(static_cast<int8_t>(v));
            back = v * scale;
          }
          const double e = static_cast<double>(back) - static_cast<double>(w[i]);
          err2 += e * e;
          norm2 += static_cast<double>(w[i]) * w[i];
          max_err = std::max(max_err, std::fabs(e));
          max_w = std::max(max_w, std::fabs(static_cast<double>(w[i])));
        }
      }
    }
  }
  out.max_rel = max_w == 0 ? 0 : max_err / max_w;
  out.rms_rel = norm2 == 0 ? 0 : std::sqrt(err2 / norm2);
  out.dtype = s.weight;
  out.block_rows = br;
  out.block_cols = bc;
  out.scale_cols = sc;
  return out;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw Error(p.string() + ": write failed (disk full?)");
}

}  // namespace

QuantizedWeight quantize_weight(const TensorView& t, const std::string& scheme) {
  if (t.shape.size() != 2) throw Error("internal: quantize_weight of a tensor that is not a matrix: " + t.name);
  return quantize_matrix(t, scheme_of(scheme));
}

bool quantizable_weight(const std::string& name) {
  if (ends_with(name, "_proj.weight")) return true;
  // Mixtral's experts: block_sparse_moe.experts.E.w1/w2/w3.weight
  return name.find(".experts.") != std::string::npos &&
         (ends_with(name, ".w1.weight") || ends_with(name, ".w2.weight") || ends_with(name, ".w3.weight"));
}

QuantizeSummary quantize_checkpoint(const QuantizeOptions& o, const std::function<void(const TensorQuantError&)>& on_tensor) {
  const Scheme scheme = scheme_of(o.scheme);
  const ModelConfig config = ModelConfig::load(o.in_dir);  // validates the model as `tandem run` would
  if (config.quant.any())
    throw Error((o.in_dir / "config.json").string() + ": the checkpoint is already quantized (" + config.quant.name() +
                "); quantize a bf16, f16 or f32 checkpoint");
  std::error_code ec;
  if (fs::exists(o.out_dir, ec) && (!fs::is_directory(o.out_dir, ec) || !fs::is_empty(o.out_dir, ec)))
    throw Error(o.out_dir.string() + ": exists and is not an empty directory; give --out a new directory");
  fs::create_directories(o.out_dir, ec);
  if (ec) throw Error(o.out_dir.string() + ": cannot create (" + ec.message() + ")");

  const auto ckpt = Checkpoint::open(o.in_dir);
  std::map<std::string, std::vector<const TensorView*>> by_file;  // shard name -> its tensors, by name
  for (const auto& [name, t] : ckpt->tensors()) by_file[fs::path(t.file).filename().string()].push_back(&t);

  // Decided once per tensor: the header is written before the data, and both must agree.
  auto quantized = [](const TensorView& t) { return quantizable_weight(t.name) && t.shape.size() == 2; };
  auto scale_name = [&](const TensorView& t) { return t.name.substr(0, t.name.size() - 6) + scheme.scale_suffix; };
  QuantizeSummary summary;
  json weight_map = json::object();
  for (const auto& [file, tensors] : by_file) {
    std::vector<TensorSpec> specs;
    for (const TensorView* t : tensors) {
      if (quantized(*t)) {
        specs.push_back({t->name, scheme.weight, t->shape});
        specs.push_back({scale_name(*t), DType::kF32,
                         {scheme.scale_rows(t->shape[0]), scheme.scale_cols(t->shape[1])}});
      } else {
        specs.push_back({t->name, t->dtype, t->shape});
      }
    }
    SafetensorsWriter writer(o.out_dir / file, specs);
    for (const TensorView* t : tensors) {
      const auto bytes = static_cast<std::size_t>(t->numel()) * dtype_size(t->dtype);
      summary.bytes_in += bytes;
      weight_map[t->name] = file;
      if (!quantized(*t)) {
        writer.write(t->data, bytes);
        summary.bytes_out += bytes;
        ++summary.kept;
      } else {
        const Quantized q = quantize_matrix(*t, scheme);
        writer.write(q.q.data(), q.q.size());
        writer.write(q.scales.data(), q.scales.size() * sizeof(float));
        summary.bytes_out += q.q.size() + q.scales.size() * sizeof(float);
        weight_map[scale_name(*t)] = file;
        ++summary.quantized;
        const TensorQuantError e{t->name, t->shape[0], t->shape[1], q.max_rel, q.rms_rel};
        if (e.max_rel >= summary.worst_max.max_rel) summary.worst_max = e;
        if (e.rms_rel >= summary.worst_rms.rms_rel) summary.worst_rms = e;
        if (on_tensor) on_tensor(e);
      }
      ckpt->release(t->data, bytes);  // memory stays bounded by one tensor
    }
    writer.finish();
  }
  if (summary.quantized == 0)
    throw Error(o.in_dir.string() + ": no linear-layer weights (*_proj.weight) to quantize");

  if (fs::exists(o.in_dir / "model.safetensors.index.json")) {
    json index = {{"metadata", {{"total_size", summary.bytes_out}}}, {"weight_map", weight_map}};
    write_text(o.out_dir / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  json cfg = json::parse(read_file(o.in_dir / "config.json"));
  cfg["quantization_config"] = quantization_config(scheme);
  write_text(o.out_dir / "config.json", cfg.dump(2) + "\n");
  // The tokenizer, its config, the chat template, generation_config.json: everything else, as it is.
  for (const auto& entry : fs::directory_iterator(o.in_dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name == "config.json" || name == "model.safetensors.index.json" ||
        ends_with(name, ".safetensors"))
      continue;
    fs::copy_file(entry.path(), o.out_dir / name, fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error((o.out_dir / name).string() + ": cannot copy (" + ec.message() + ")");
  }
  return summary;
}

}  // namespace tandem::runtime
