// What the GPU tests share: a relative error against a reference, device
// copies of host vectors, random inputs, and a KV pool in device memory.
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kv/block_pool.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/backend.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/model/model_config.h"
#include "runtime/model/quantize.h"
#include "runtime/model/weights.h"
#include "../unit/runtime/test_model.h"

namespace tandem::testing {

// max |a - b| / max(1, max |b|): relative to the reference's scale; infinite
// when a holds a NaN or an infinity (max() would pass a NaN over).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// A device copy of a host vector (get: back to the host, after the device is idle).
template <class T>
struct Dev {
  T* p = nullptr;
  explicit Dev(const std::vector<T>& host) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), host.size() * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> get(std::size_t n) const {
    std::vector<T> out(n);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }
};

inline std::vector<float> random_floats(std::size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The device memory what `make` returns holds (a model, say), measured
// while it is alive: free memory before make() and after it, the device idle.
template <class F>
double device_bytes_of(F&& make) {
  std::size_t before = 0, after = 0, total = 0;
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemGetInfo(&before, &total) == cudaSuccess);
  [[maybe_unused]] const auto held = make();  // alive until the measure
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemGetInfo(&after, &total) == cudaSuccess);
  return static_cast<double>(before) - static_cast<double>(after);
}

// `source` written by tandem quantize (--scheme fp8-block | int8-channel) beside it and loaded both ways:
// panels for the CPU engine, row-major for the CUDA backend; the directory is removed with it.
struct QuantizedModel {
  std::filesystem::path dir;
  runtime::ModelConfig config;
  std::unique_ptr<runtime::ModelWeights> panels, rowmajor;
  QuantizedModel(const std::filesystem::path& source, const std::string& scheme) : dir(source.string() + "-" + scheme) {
    runtime::quantize_checkpoint({source, dir, scheme});
    config = runtime::ModelConfig::load(dir);
    panels = runtime::ModelWeights::load(config, dir);
    rowmajor = runtime::ModelWeights::load(config, dir, false);
  }
  ~QuantizedModel() { std::filesystem::remove_all(dir); }
  QuantizedModel(const QuantizedModel&) = delete;
  QuantizedModel& operator=(const QuantizedModel&) = delete;
};

// A pool in device memory.
struct DevPool {
  kv::KvLayout layout;
  std::shared_ptr<void> mem;
  std::unique_ptr<kv::BlockPool> pool;
  DevPool(const runtime::ModelConfig& c, int64_t blocks, int64_t elem_bytes = 4) : layout{c.layers, c.kv_heads, c.head_dim, 16} {
    layout.elem_bytes = elem_bytes;
    mem = runtime::allocate_pool_memory("cuda", static_cast<std::size_t>(blocks) * layout.block_bytes());
    pool = std::make_unique<kv::BlockPool>(layout, blocks, static_cast<float*>(mem.get()));
  }
};

// Every logit of a 53-token prompt: 50 prefilled in chunks of 20, then 3
// single-token (decode) steps; one sequence in the pool's first 4 blocks.
// follower: the same steps as a group's follower runs them
// (forward_follower), each of which must return no logits.
inline std::vector<float> chunked_logits(runtime::ModelBackend& m, kv::BlockPool& pool, const std::vector<int32_t>& prompt,
                                         bool follower = false) {
  auto blocks = *pool.allocate(4);
  std::vector<float> all, part;
  for (int64_t s = 0; s < 53;) {
    const int64_t n = s < 50 ? std::min<int64_t>(20, 50 - s) : 1;
    runtime::SeqChunk c;
    c.start_pos = s;
    c.tokens = std::span<const int32_t>(prompt.data() + s, static_cast<std::size_t>(n));
    c.block_table = blocks;
    c.logits_all = true;
    if (follower) {
      part.assign(1, 0.0f);  // forward_follower must leave it empty
      m.forward_follower(std::span<runtime::SeqChunk>(&c, 1), part);
    } else {
      m.forward(std::span<const runtime::SeqChunk>(&c, 1), part);
    }
    all.insert(all.end(), part.begin(), part.end());
    s += n;
  }
  return all;
}

// Six requests of random prompts (ids below 1000, from `seed`), 32 greedy
// tokens each, through an engine on the CPU and one on the CUDA backend
// (rowmajor: the model's weights loaded without panels): the same tokens.
inline void check_greedy_like_cpu(const TinyModel& tiny, const runtime::ModelWeights& rowmajor, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<runtime::EngineRequest> reqs;
  for (uint64_t i = 0; i < 6; ++i) {
    std::vector<int32_t> p(10 + 7 * i);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 1000);
    runtime::EngineRequest r{i, p, {}, 9 + i};
    r.params.max_tokens = 32;
    r.params.ignore_eos = true;
    r.params.temperature = 0;
    reqs.push_back(r);
  }
  const kv::KvLayout layout{tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16};
  kv::BlockPool cpu_pool(layout, 64);
  runtime::cpu::ThreadPool threads(2);
  runtime::Engine cpu_engine(tiny.config, *tiny.weights, cpu_pool, threads, nullptr, runtime::EngineOptions{4, 64, 0, true});
  DevPool dev(tiny.config, 64);
  runtime::Engine gpu_engine(tiny.config, std::make_unique<runtime::cuda::CudaModel>(tiny.config, rowmajor, *dev.pool),
                             *dev.pool, nullptr, runtime::EngineOptions{4, 64, 0, true});
  const auto want = run_to_end(cpu_engine, reqs), got = run_to_end(gpu_engine, reqs);
  for (const auto& [id, tokens] : want) {
    INFO("request " << id);
    CHECK(got.at(id) == tokens);
  }
}

}  // namespace tandem::testing
