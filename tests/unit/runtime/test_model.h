// A tiny random Qwen3 checkpoint made once per test binary, for engine tests.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include <unistd.h>

#include "runtime/engine/engine.h"
#include "runtime/model/make_model.h"
#include "runtime/model/weights.h"
#include "tokenizer_files.h"

namespace tandem::testing {

struct TinyModel {
  std::filesystem::path dir;
  runtime::ModelConfig config;
  std::unique_ptr<runtime::ModelWeights> weights;

  explicit TinyModel(const std::string& arch = "qwen3", const std::string& dtype = "f32") {
    dir = std::filesystem::temp_directory_path() /
          ("tandem-tiny-" + arch + "-" + dtype + "-" + std::to_string(::getpid()));
    runtime::MakeModelOptions o;
    o.arch = arch;
    o.preset = "tiny";
    o.dtype = dtype;
    o.tokenizer_dir = tokenizer_dir("qwen3");
    o.out_dir = dir;
    o.seed = 11;
    config = runtime::make_model(o);
    weights = runtime::ModelWeights::load(config, dir);
  }
  ~TinyModel() { std::filesystem::remove_all(dir); }
};

// Adds the requests and steps the engine until it is idle: each request's tokens by id.
inline std::map<uint64_t, std::vector<int32_t>> run_to_end(runtime::Engine& e,
                                                           const std::vector<runtime::EngineRequest>& reqs) {
  for (const auto& r : reqs) e.add(r);
  std::map<uint64_t, std::vector<int32_t>> out;
  while (e.has_work())
    for (auto& o : e.step())
      if (o.finished) out[o.id] = o.tokens;
  return out;
}

}  // namespace tandem::testing
