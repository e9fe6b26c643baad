// The CUDA backend in a tensor-parallel group, on one GPU: a group of 2 or 4
// threads, each with its own model shard, pool and stream, exchanging their
// partial sums (and a MoE layer's slots) through device buffers (in place of
// NCCL, which takes one GPU per rank). Every rank must end each step with the same logits, bit for bit
// (the group's sum is added in rank order on each), and those logits must
// match the CPU engine's as closely as one CUDA rank's do.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "runtime/cpu/cpu_model.h"
#include "runtime/cpu/tp_group.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/engine/device_group.h"
#include "runtime/model/make_model.h"
#include "runtime/model/quantize.h"
#include "../unit/runtime/test_model.h"
#include "gpu_helpers.h"

using namespace tandem;
using namespace tandem::runtime;
using tandem::testing::DevPool;
using tandem::testing::rel_err;

namespace {

// One thread per rank on the current device; the gather through the ranks' own buffers.
class ThreadDeviceGroup {
 public:
  explicit ThreadDeviceGroup(int width) : width_(width), mine_(static_cast<std::size_t>(width)), sync_(width) {}

  class Member : public DeviceGroup {
   public:
    Member(ThreadDeviceGroup& g, int rank) : g_(g), rank_(rank) {}
    cpu::TpShard shard() const override { return {rank_, g_.width_}; }
    bool graph_safe() const override { return false; }  // it waits for the stream on the host
    // Catch's checks are not for threads: a CUDA error is counted, and checked after the threads have joined.
    void all_gather(const float* mine, float* all, int64_t n, void* stream) override {
      auto* s = static_cast<cudaStream_t>(stream);
      g_.note(cudaStreamSynchronize(s));  // this rank's partial sums are complete
      g_.mine_[static_cast<std::size_t>(rank_)] = mine;
      g_.sync_.arrive_and_wait();
      for (int r = 0; r < g_.width_; ++r) {
        const float* theirs = g_.mine_[static_cast<std::size_t>(r)];
        if (!theirs) {  // a rank that failed has left
          ++g_.errors_;
          continue;
        }
        g_.note(cudaMemcpyAsync(all + r * n, theirs, static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToDevice, s));
      }
      g_.note(cudaStreamSynchronize(s));
      g_.sync_.arrive_and_wait();  // no rank overwrites its sums before every rank has copied them
    }

    void all_to_all(const float* send, float* recv, int64_t n, void* stream) override {
      auto* s = static_cast<cudaStream_t>(stream);
      g_.note(cudaStreamSynchronize(s));  // this rank's blocks are complete
      g_.mine_[static_cast<std::size_t>(rank_)] = send;
      g_.sync_.arrive_and_wait();
      for (int r = 0; r < g_.width_; ++r) {
        const float* theirs = g_.mine_[static_cast<std::size_t>(r)];
        if (!theirs) {
          ++g_.errors_;
          continue;
        }
        g_.note(cudaMemcpyAsync(recv + r * n, theirs + rank_ * n, static_cast<std::size_t>(n) * 4,
                                cudaMemcpyDeviceToDevice, s));
      }
      g_.note(cudaStreamSynchronize(s));
      g_.sync_.arrive_and_wait();
    }

   private:
    ThreadDeviceGroup& g_;
    int rank_;
  };

  // A rank that failed leaves: the others' exchanges go on without it (and fail, rather than wait for ever).
  void leave(int rank) {
    mine_[static_cast<std::size_t>(rank)] = nullptr;  // its buffers are gone
    sync_.arrive_and_drop();
  }
  int cuda_errors() const { return errors_.load(); }

 private:
  void note(cudaError_t e) {
    if (e != cudaSuccess) ++errors_;
  }
  int width_;
  std::vector<const float*> mine_;
  std::barrier<> sync_;
  std::atomic<int> errors_{0};
};

// A 53-token prompt (ids below 1000) from `seed`, and the CPU engine's logits for it: the reference.
std::vector<int32_t> random_prompt(unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> prompt(53);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 1000);
  return prompt;
}

std::vector<float> cpu_logits(const testing::TinyModel& tiny, const std::vector<int32_t>& prompt) {
  cpu::ThreadPool threads(2);
  kv::BlockPool cpu_pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 8);
  cpu::CpuModel cpu_model(tiny.config, *tiny.weights, cpu_pool, threads);
  return testing::chunked_logits(cpu_model, cpu_pool, prompt);
}

// The logits for the prompt of a group of `width` threads on this GPU
// (expert_parallel: a MoE model's experts whole on their ranks), after
// checking that no rank failed, each gave `size` logits, and every rank's
// are rank 0's bit for bit; each rank's expert counts in expert_tokens.
// followers: ranks 1 on run their steps as a group's followers do
// (forward_follower: no LM head) and must give no logits.
std::vector<float> run_group(const ModelConfig& config, const ModelWeights& rowmajor, int width,
                             const std::vector<int32_t>& prompt, bool expert_parallel, std::size_t size,
                             std::vector<std::vector<int64_t>>* expert_tokens = nullptr, bool followers = false) {
  ThreadDeviceGroup group(width);
  std::vector<std::vector<float>> got(static_cast<std::size_t>(width));
  std::vector<std::string> errors(static_cast<std::size_t>(width));
  if (expert_tokens) expert_tokens->assign(static_cast<std::size_t>(width), {});
  std::vector<std::thread> ranks;
  for (int r = 0; r < width; ++r)
    ranks.emplace_back([&, r] {
      try {
        ThreadDeviceGroup::Member member(group, r);
        const ModelConfig shard = cpu::shard_config(config, member.shard());
        DevPool dev(shard, 8);
        cuda::CudaModel model(config, rowmajor, *dev.pool, &member, expert_parallel);
        got[static_cast<std::size_t>(r)] = testing::chunked_logits(model, *dev.pool, prompt, followers && r > 0);
        if (expert_tokens) (*expert_tokens)[static_cast<std::size_t>(r)] = model.expert_tokens();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        group.leave(r);
      }
    });
  for (auto& t : ranks) t.join();
  CHECK(group.cuda_errors() == 0);
  for (int r = 0; r < width; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[static_cast<std::size_t>(r)].empty());
    if (followers && r > 0) {
      CHECK(got[static_cast<std::size_t>(r)].empty());
      continue;
    }
    REQUIRE(got[static_cast<std::size_t>(r)].size() == size);
    CHECK(got[static_cast<std::size_t>(r)] == got[0]);
  }
  return got[0];
}

}  // namespace

TEST_CASE("a tensor-parallel group of 2 and 4 CUDA ranks: every rank the same logits bit for bit, as close to the CPU "
          "engine's as one rank's",
          "[gpu]") {
  // Qwen3 (q/k norm), Qwen2 (q/k/v bias sliced per rank), Llama in bf16 (tensor cores); the tiny model's 2 KV heads
  // are replicated at width 4.
  const std::pair<const char*, const char*> models[] = {{"qwen3", "f32"}, {"qwen2", "f32"}, {"llama", "bf16"}};
  for (const auto& [arch, dtype] : models) {
    testing::TinyModel tiny(arch, dtype);
    auto rowmajor = ModelWeights::load(tiny.config, tiny.dir, false);
    const std::vector<int32_t> prompt = random_prompt(5);
    const std::vector<float> want = cpu_logits(tiny, prompt);
    const bool f32 = std::string(dtype) == "f32";
    for (const int width : {2, 4}) {
      INFO(arch << " " << dtype << ", width " << width);
      const std::vector<float> got = run_group(tiny.config, *rowmajor, width, prompt, true, want.size());
      const double err = rel_err(got, want);
      std::printf("cuda tp %d %s %s: largest logit difference from the CPU engine %.3g (relative)\n", width, arch, dtype,
                  err);
      CHECK(err < (f32 ? 1e-4 : 3e-2));
      // The leader's logits the same bits where its followers compute none (the steps laid out as the leader's).
      CHECK(run_group(tiny.config, *rowmajor, width, prompt, true, want.size(), nullptr, true) == got);
    }
  }
}

// What a rank copies to its GPU: its shard of the layers, and the embedding
// whole. A model whose layers outweigh its (tied) embedding, each rank's
// device memory measured as the model is made (the pool and cuBLAS's
// workspace alike at every width, so the differences are the weights').
TEST_CASE("a rank of a CUDA group holds its shard of the layers on its GPU: its device memory falls with the width",
          "[gpu]") {
  MakeModelOptions o;
  o.arch = "llama";
  o.preset = "small";
  o.dtype = "bf16";
  o.hidden = 512, o.heads = 8, o.kv_heads = 4, o.head_dim = 64, o.intermediate = 4096, o.layers = 8;
  o.tie_embeddings = true;
  o.tokenizer_dir = testing::tokenizer_dir("qwen3");
  o.out_dir = std::filesystem::temp_directory_path() / ("tandem-gpu-shard-" + std::to_string(::getpid()));
  const ModelConfig config = make_model(o);
  auto weights = ModelWeights::load(config, o.out_dir, false);
  const double layer_bytes = 8.0 * 2 * (4.0 * 512 * 512 - 2.0 * 512 * 256 + 3.0 * 512 * 4096);  // q, o + k, v at GQA 8/4; MLP
  std::map<int, double> used;
  for (const int width : {1, 2, 4}) {
    ThreadDeviceGroup group(width);
    ThreadDeviceGroup::Member member(group, 0);
    DevPool dev(cpu::shard_config(config, member.shard()), 8);
    used[width] = testing::device_bytes_of([&] { return std::make_unique<cuda::CudaModel>(config, *weights, *dev.pool, &member); });
    std::printf("cuda tp %d: rank 0 holds %.1f MiB on its GPU (layers of the whole model: %.1f MiB)\n", width,
                used[width] / (1 << 20), layer_bytes / (1 << 20));
  }
  std::filesystem::remove_all(o.out_dir);
  // Each halving of the width takes half the rank's layers off its GPU (1/2, then 1/4 of them), give or take the
  // allocator's rounding of each matrix to its pages.
  CHECK(used[1] - used[2] > 0.35 * layer_bytes);
  CHECK(used[2] - used[4] > 0.15 * layer_bytes);
}

// What a regroup does to a CUDA rank (launcher/run/worker_rank.cpp): its
// model at one width goes, the same device memory is laid out as the other
// width's KV blocks, and its shard at that width is uploaded; the group's
// exchange was made once, at the start, and serves again when the cell
// comes back. Two ranks, as a cell of 2: a worker of 2, then two workers of
// 1, then a worker of 2 again, each on the memory the rank registered once.
// Each form must give the CPU engine's logits, and the same bits when it
// comes back.
TEST_CASE("a cell of 2 CUDA ranks regroups: width 2, two of width 1, width 2 again, on the memory each set up once",
          "[gpu]") {
  testing::TinyModel tiny("qwen3", "f32");
  auto rowmajor = ModelWeights::load(tiny.config, tiny.dir, false);
  const std::vector<int32_t> prompt = random_prompt(9);
  const std::vector<float> want = cpu_logits(tiny, prompt);

  auto layout_at = [&](int rank, int width) {
    const ModelConfig shard = cpu::shard_config(tiny.config, {rank, width});
    return kv::KvLayout{shard.layers, shard.kv_heads, shard.head_dim, 16};
  };
  // Room for 8 blocks of the wider form's or the narrower's, whichever is more (the narrower's: all KV heads).
  const std::size_t capacity = 8 * std::max(layout_at(0, 1).block_bytes(), layout_at(0, 2).block_bytes());
  {
    ThreadDeviceGroup group(2);  // as the NCCL exchange each rank sets up once
    std::vector<std::vector<float>> got[3];
    for (auto& g : got) g.resize(2);
    std::vector<std::string> errors(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        try {
          std::shared_ptr<void> memory = allocate_pool_memory("cuda", capacity);  // registered once
          ThreadDeviceGroup::Member member(group, r);
          for (int form = 0; form < 3; ++form) {
            const int width = form == 1 ? 1 : 2;
            const kv::KvLayout layout = layout_at(width == 1 ? 0 : r, width);
            kv::BlockPool pool(layout, static_cast<int64_t>(capacity / layout.block_bytes()),
                               static_cast<float*>(memory.get()));
            cuda::CudaModel model(tiny.config, *rowmajor, pool, width == 1 ? nullptr : &member);
            got[form][static_cast<std::size_t>(r)] = testing::chunked_logits(model, pool, prompt);
          }
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
          group.leave(r);
        }
      });
    for (auto& t : ranks) t.join();
    CHECK(group.cuda_errors() == 0);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      REQUIRE(errors[static_cast<std::size_t>(r)].empty());
      for (int form = 0; form < 3; ++form) {
        INFO("form " << form << " (width " << (form == 1 ? 1 : 2) << ")");
        REQUIRE(got[form][static_cast<std::size_t>(r)].size() == want.size());
        CHECK(rel_err(got[form][static_cast<std::size_t>(r)], want) < 1e-4);
      }
      CHECK(got[2][static_cast<std::size_t>(r)] == got[0][static_cast<std::size_t>(r)]);  // back: the same bits
      CHECK(got[1][static_cast<std::size_t>(r)] == got[1][0]);  // two workers of 1: the same model
    }
    std::printf("cuda regroup 2 -> 1 -> 2: largest logit difference from the CPU engine %.3g (width 2), %.3g (width 1)\n",
                rel_err(got[0][0], want), rel_err(got[1][0], want));
  }
}

// A mixture of experts in a CUDA group: experts whole on their ranks (each
// home's slots by all-to-all, combined there, the rows gathered) or every
// expert's units split (the slots' partial sums added in the tree). Every
// rank ends each step with the same bits, as close to the CPU engine as one
// rank, and every rank counts every expert's rows (the CPU's counts).
TEST_CASE("a MoE model in a CUDA group of 2 and 4, experts whole (expert parallelism) or split: every rank the same "
          "logits bit for bit, as close to the CPU engine's as one rank's",
          "[gpu]") {
  for (const char* arch : {"qwen3_moe", "mixtral"}) {
    testing::TinyModel tiny(arch, "f32");
    auto rowmajor = ModelWeights::load(tiny.config, tiny.dir, false);
    const std::vector<int32_t> prompt = random_prompt(6);
    cpu::ThreadPool threads(2);
    kv::BlockPool cpu_pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 8);
    cpu::CpuModel cpu_model(tiny.config, *tiny.weights, cpu_pool, threads);
    const std::vector<float> want = testing::chunked_logits(cpu_model, cpu_pool, prompt);
    for (const int width : {2, 4})
      for (const bool ep : {true, false}) {
        INFO(arch << ", width " << width << (ep ? ", experts whole" : ", experts split"));
        std::vector<std::vector<int64_t>> counts;
        const double err = rel_err(run_group(tiny.config, *rowmajor, width, prompt, ep, want.size(), &counts), want);
        for (const auto& c : counts) CHECK(c == cpu_model.expert_tokens());
        std::printf("cuda %s width %d, experts %s: largest logit difference from the CPU engine %.3g (relative)\n", arch,
                    width, ep ? "whole" : "split", err);
        CHECK(err < 1e-4);
      }
  }
}

// With experts whole on their ranks a rank uploads E / width of them: its
// device memory falls by the experts it does not hold.
TEST_CASE("a rank of a CUDA group with expert parallelism holds its experts only: its device memory falls with the width",
          "[gpu]") {
  MakeModelOptions o;
  o.arch = "qwen3_moe";
  o.preset = "small";
  o.dtype = "bf16";
  o.hidden = 512, o.heads = 8, o.kv_heads = 4, o.head_dim = 64, o.layers = 4;
  o.experts = 8, o.experts_per_token = 2, o.moe_intermediate = 1024;
  o.dense_layers = std::vector<int64_t>{};
  o.tie_embeddings = true;
  o.tokenizer_dir = testing::tokenizer_dir("qwen3");
  o.out_dir = std::filesystem::temp_directory_path() / ("tandem-gpu-experts-" + std::to_string(::getpid()));
  const ModelConfig config = make_model(o);
  auto weights = ModelWeights::load(config, o.out_dir, false);
  const double expert_bytes = 4.0 * 8 * 3 * 512 * 1024 * 2;  // layers x experts x (gate, up, down) x bf16
  std::map<int, double> used;
  for (const int width : {1, 2, 4}) {
    ThreadDeviceGroup group(width);
    ThreadDeviceGroup::Member member(group, 0);
    DevPool dev(cpu::shard_config(config, member.shard()), 8);
    used[width] = testing::device_bytes_of(
        [&] { return std::make_unique<cuda::CudaModel>(config, *weights, *dev.pool, &member, true); });
    std::printf("cuda ep %d: rank 0 holds %.1f MiB on its GPU (the experts of the whole model: %.1f MiB)\n", width,
                used[width] / (1 << 20), expert_bytes / (1 << 20));
  }
  std::filesystem::remove_all(o.out_dir);
  CHECK(used[1] - used[2] > 0.4 * expert_bytes);
  CHECK(used[2] - used[4] > 0.2 * expert_bytes);
}

// An 8-bit checkpoint whose hidden size is 2.5 blocks of 128 (so a row's
// scales cross blocks, and a rank's columns of o_proj and down_proj start
// inside one): on one rank and in groups of 2 and 4, the CPU engine's logits
// (both on code x scale in float32), its layers a byte a weight on the GPU.
TEST_CASE("an 8-bit checkpoint with a dimension of 2.5 blocks, on one CUDA rank and in groups of 2 and 4: the CPU "
          "engine's logits (< 1e-4), its layers at a byte a weight on the GPU",
          "[gpu]") {
  MakeModelOptions o;
  o.arch = "qwen3";
  o.preset = "small";
  o.dtype = "f32";
  o.hidden = 320, o.layers = 4;
  o.tokenizer_dir = testing::tokenizer_dir("qwen3");
  o.out_dir = std::filesystem::temp_directory_path() / ("tandem-gpu-q8-" + std::to_string(::getpid()));
  const ModelConfig f32_config = make_model(o);
  const auto f32_weights = ModelWeights::load(f32_config, o.out_dir, false);
  const double f32_layers = 4.0 * 4 * (f32_config.hidden * (f32_config.heads + 2 * f32_config.kv_heads) * f32_config.head_dim +
                                       f32_config.heads * f32_config.head_dim * f32_config.hidden +
                                       3.0 * f32_config.hidden * f32_config.intermediate);  // f32 bytes
  const std::vector<int32_t> prompt = random_prompt(12);
  for (const char* scheme : {"fp8-block", "int8-channel"}) {
    INFO(scheme);
    const testing::QuantizedModel q(o.out_dir, scheme);
    const ModelConfig& config = q.config;
    const auto& rowmajor = q.rowmajor;
    cpu::ThreadPool threads(2);
    kv::BlockPool cpu_pool({config.layers, config.kv_heads, config.head_dim, 16}, 8);
    cpu::CpuModel cpu_model(config, *q.panels, cpu_pool, threads);
    const std::vector<float> want = testing::chunked_logits(cpu_model, cpu_pool, prompt);
    {
      DevPool dev(config, 8);
      std::unique_ptr<cuda::CudaModel> model;
      const double held = testing::device_bytes_of([&] {
        model = std::make_unique<cuda::CudaModel>(config, *rowmajor, *dev.pool);
        return 0;
      });
      const double f32_held =
          testing::device_bytes_of([&] { return std::make_unique<cuda::CudaModel>(f32_config, *f32_weights, *dev.pool); });
      const double err = rel_err(testing::chunked_logits(*model, *dev.pool, prompt), want);
      std::printf("cuda %s, hidden 2.5 blocks: largest logit difference from the CPU engine %.3g; device memory %.1f "
                  "MiB against the f32 model's %.1f MiB (its layers %.1f MiB)\n",
                  scheme, err, held / (1 << 20), f32_held / (1 << 20), f32_layers / (1 << 20));
      CHECK(err < 1e-4);
      CHECK(f32_held - held > 0.5 * f32_layers);  // a byte a weight where f32 takes four
    }
    for (const int width : {2, 4}) {
      INFO("width " << width);
      const double err = rel_err(run_group(config, *rowmajor, width, prompt, true, want.size()), want);
      std::printf("cuda %s, hidden 2.5 blocks, width %d: largest logit difference from the CPU engine %.3g\n", scheme,
                  width, err);
      CHECK(err < 1e-4);
    }
  }
  std::filesystem::remove_all(o.out_dir);
}

namespace {

// A group's rank whose exchanges stay on its own stream (every rank's part a
// copy of its own): the values are not a group's, but a step with them can
// be captured in a graph, so the ranks of a group, run one after another on
// one GPU, each capture and replay what they would with NCCL.
class LocalMember : public DeviceGroup {
 public:
  LocalMember(int rank, int width) : rank_(rank), width_(width) {}
  cpu::TpShard shard() const override { return {rank_, width_}; }
  void all_gather(const float* mine, float* all, int64_t n, void* stream) override {
    for (int r = 0; r < width_; ++r) copy(all + r * n, mine, n, stream);
  }
  void all_to_all(const float* send, float* recv, int64_t n, void* stream) override {
    for (int q = 0; q < width_; ++q) copy(recv + q * n, send + q * n, n, stream);
  }
  int errors = 0;

 private:
  void copy(float* to, const float* from, int64_t n, void* stream) {
    errors += cudaMemcpyAsync(to, from, static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToDevice,
                              static_cast<cudaStream_t>(stream)) != cudaSuccess;
  }
  int rank_, width_;
};

// Steps as a group's rank runs them (the leader forward, a follower
// forward_follower), and what became of them: three prompts, decode batches
// of 1 and 3 (each eager, then captured, then replayed), a step whose
// one-token row wants no logits, a prompt whose every logit comes back (the
// leader's logits grow: the graphs go), and decode batches of 3 again.
cuda::CudaModel::GraphCounts graph_run(cuda::CudaModel& m, kv::BlockPool& pool, bool leader) {
  std::vector<std::vector<int32_t>> blocks;
  for (int s = 0; s < 3; ++s) blocks.push_back(*pool.allocate(4));  // 64 positions a sequence
  std::mt19937 rng(3);
  std::vector<int32_t> ids(3 * 64);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 1000);
  int64_t pos[3] = {0, 0, 0};
  std::vector<float> logits;
  // n tokens of each sequence in seqs; logits for the last (all: for every token) where wanted.
  auto step = [&](std::vector<int> seqs, int64_t n, bool last, bool all = false) {
    std::vector<SeqChunk> chunks;
    for (const int s : seqs) {
      SeqChunk c;
      c.start_pos = pos[s];
      c.tokens = std::span<const int32_t>(ids.data() + 64 * s + pos[s], static_cast<std::size_t>(n));
      c.block_table = blocks[static_cast<std::size_t>(s)];
      c.logits_last = last || s == 0;  // the first sequence's always
      c.logits_all = all;
      chunks.push_back(c);
      pos[s] += n;
    }
    if (leader)
      m.forward(chunks, logits);
    else
      m.forward_follower(chunks, logits);
  };
  step({0, 1, 2}, 10, true);
  for (int i = 0; i < 3; ++i) step({0}, 1, true);
  for (int i = 0; i < 3; ++i) step({0, 1, 2}, 1, true);
  step({0, 1}, 1, false);  // the second row wants none
  step({2}, 20, true, true);
  for (int i = 0; i < 3; ++i) step({0, 1, 2}, 1, true);
  return m.graph_counts();
}

}  // namespace

// NCCL asks that a captured exchange be captured on every rank of it: a
// group's leader and followers must capture, replay and drop their graphs at
// the same steps, though only the leader computes logits and the ranks'
// shards of the MLP (301 units; an expert's, split) differ by a unit.
TEST_CASE("the ranks of a CUDA group capture, replay and drop their decode graphs at the same steps", "[gpu]") {
  for (const char* arch : {"qwen3", "qwen3_moe"}) {
    MakeModelOptions o;
    o.arch = arch;
    o.preset = "tiny";
    o.dtype = "f32";
    o.intermediate = 301;
    if (std::string(arch) == "qwen3_moe") o.moe_intermediate = 301;
    o.tokenizer_dir = testing::tokenizer_dir("qwen3");
    o.out_dir = std::filesystem::temp_directory_path() / ("tandem-gpu-graphs-" + std::to_string(::getpid()));
    const ModelConfig config = make_model(o);
    auto weights = ModelWeights::load(config, o.out_dir, false);
    for (const int width : {2, 4})
      for (const bool ep : {true, false}) {
        if (!ep && !config.moe.any()) continue;
        INFO(arch << ", width " << width << (ep ? "" : ", experts split"));
        std::vector<cuda::CudaModel::GraphCounts> counts;
        for (int r = 0; r < width; ++r) {
          LocalMember member(r, width);
          DevPool dev(cpu::shard_config(config, member.shard()), 16);
          cuda::CudaModel model(config, *weights, *dev.pool, &member, ep);
          counts.push_back(graph_run(model, *dev.pool, r == 0));
          REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
          CHECK(member.errors == 0);
        }
        const auto& c = counts[0];
        std::printf("cuda graphs, %s width %d: %ld eager, %ld captured, %ld replayed, %ld drops on every rank\n", arch,
                    width, static_cast<long>(c.eager), static_cast<long>(c.captured), static_cast<long>(c.replayed),
                    static_cast<long>(c.dropped));
        // Eager: the prompts, each batch size's first step, the step with a row wanting no logits, the 20-token
        // prompt. Dropped: batch 1's graph when batch 3's split attention grows its scratch, batch 3's when the
        // leader's logits grow.
        CHECK(c.eager == 6);
        CHECK(c.captured == 3);  // batch 1, batch 3, batch 3 after the drop
        CHECK(c.replayed == 3);
        CHECK(c.dropped == 2);
        for (int r = 1; r < width; ++r) {
          INFO("rank " << r);
          CHECK(counts[static_cast<std::size_t>(r)] == c);
        }
      }
    std::filesystem::remove_all(o.out_dir);
  }
}
