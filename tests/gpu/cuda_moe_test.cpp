// The CUDA backend's mixture-of-experts layers: the ops (routing, grouping
// by expert, the grouped products, the combine) against host arithmetic in
// the transport conformance style (every expert owned by another rank, empty
// experts, every row to one expert), and Qwen3-MoE and Mixtral models
// against the CPU engine.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "runtime/cpu/cpu_model.h"
#include "runtime/cpu/expert_parallel.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/ops.h"
#include "../unit/runtime/test_model.h"
#include "gpu_helpers.h"

using namespace tandem;
using namespace tandem::runtime;
namespace cu = tandem::runtime::cuda;
using tandem::testing::Dev;
using tandem::testing::DevPool;
using tandem::testing::random_floats;
using tandem::testing::rel_err;

namespace {

double silu_mul(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

// One MoE layer's ops on the device for `rows` rows of x, this "rank" holding
// experts [first, first + count); the host's double-precision expert outputs
// for the same routing beside them.
struct LayerCase {
  int64_t rows = 0, E = 8, K = 2, H = 48, U = 40, first = 0, count = 8;
  bool renormalise = true;  // Mixtral's, and Qwen3-MoE's with norm_topk_prob
  std::vector<float> logits;  // [rows][E]: the router's output, given
};

void check_layer(const LayerCase& c) {
  const int64_t R = c.rows, E = c.E, K = c.K, H = c.H, U = c.U, slots = R * K;
  const std::vector<float> x = random_floats(static_cast<std::size_t>(R * H), 1);
  const std::vector<float> gate_up = random_floats(static_cast<std::size_t>(E * 2 * U * H), 2, 0.2f);
  const std::vector<float> down = random_floats(static_cast<std::size_t>(E * H * U), 3, 0.2f);
  std::vector<int32_t> want_expert;
  std::vector<float> want_weight;
  std::vector<float> probs = c.logits;  // the CPU engine's routing (cpu/expert_parallel.h)
  want_expert.resize(static_cast<std::size_t>(slots));
  want_weight.resize(static_cast<std::size_t>(slots));
  cpu::route_rows(probs.data(), R, E, K, c.renormalise, want_expert.data(), want_weight.data());

  Dev<float> d_logits(c.logits), d_x(x);
  Dev<int32_t> d_expert(std::vector<int32_t>(static_cast<std::size_t>(slots))), d_order(std::vector<int32_t>(slots + 1)),
      d_offsets(std::vector<int32_t>(static_cast<std::size_t>(c.count + 1))),
      d_tiles(std::vector<int32_t>(static_cast<std::size_t>(c.count + 1)));
  Dev<float> d_weight(std::vector<float>(static_cast<std::size_t>(slots)));
  Dev<unsigned long long> d_counted(std::vector<unsigned long long>(static_cast<std::size_t>(E), 5));
  cu::moe_route(d_logits.p, R, E, K, c.renormalise, d_expert.p, d_weight.p, nullptr);
  const auto expert = d_expert.get(static_cast<std::size_t>(slots));
  const auto weight = d_weight.get(static_cast<std::size_t>(slots));
  REQUIRE(expert == want_expert);
  // The same arithmetic step for step (exp_fixed on both sides): the probabilities and weights are the CPU's bits.
  CHECK(d_logits.get(probs.size()) == probs);
  CHECK(weight == want_weight);

  // Grouping: each local expert's slots in slot order, its tiles; every expert counted.
  const cu::RowGroups g{d_order.p, d_offsets.p, d_tiles.p};
  cu::moe_group(d_expert.p, slots, E, c.first, c.count, g, d_counted.p, nullptr);
  std::vector<int32_t> want_order, want_offsets{0}, want_tiles{0};
  for (int64_t j = 0; j < c.count; ++j) {
    for (int64_t s = 0; s < slots; ++s)
      if (expert[static_cast<std::size_t>(s)] == c.first + j) want_order.push_back(static_cast<int32_t>(s));
    const int32_t n = static_cast<int32_t>(want_order.size()) - want_offsets.back();
    want_offsets.push_back(static_cast<int32_t>(want_order.size()));
    want_tiles.push_back(want_tiles.back() + static_cast<int32_t>((n + cu::kProductTileRows - 1) / cu::kProductTileRows));
  }
  CHECK(d_offsets.get(want_offsets.size()) == want_offsets);
  CHECK(d_tiles.get(want_tiles.size()) == want_tiles);
  auto order = d_order.get(want_order.size());
  for (std::size_t j = 0; j + 1 < want_offsets.size(); ++j)  // each expert's slots, in the order the threads placed them
    std::sort(order.begin() + want_offsets[j], order.begin() + want_offsets[j + 1]);
  CHECK(order == want_order);
  const auto counted = d_counted.get(static_cast<std::size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    CHECK(counted[static_cast<std::size_t>(e)] ==
          5 + static_cast<unsigned long long>(std::count(expert.begin(), expert.end(), static_cast<int32_t>(e))));

  // The products: gate|up of each position, then down into each slot. Slots of other ranks' experts keep
  // what was there (a NaN here).
  const std::vector<float> local_gate_up(gate_up.begin() + c.first * 2 * U * H, gate_up.begin() + (c.first + c.count) * 2 * U * H);
  const std::vector<float> local_down(down.begin() + c.first * H * U, down.begin() + (c.first + c.count) * H * U);
  Dev<float> d_gu_w(local_gate_up), d_down_w(local_down), d_gu(std::vector<float>(static_cast<std::size_t>(slots * 2 * U)));
  Dev<float> d_slot(std::vector<float>(static_cast<std::size_t>(slots * H), std::nanf("")));
  const int64_t tiles = cu::product_tiles(slots, c.count);
  cu::Product gu;
  gu.in = d_x.p, gu.gather = true, gu.top_k = K, gu.w = d_gu_w.p, gu.n = 2 * U, gu.k = H, gu.out = d_gu.p;
  cu::products(gu, g, c.count, tiles, nullptr);
  cu::Product dn;
  dn.in = d_gu.p, dn.swiglu = true, dn.w = d_down_w.p, dn.n = H, dn.k = U, dn.out = d_slot.p, dn.scatter = true;
  cu::products(dn, g, c.count, tiles, nullptr);
  const auto slot_out = d_slot.get(static_cast<std::size_t>(slots * H));
  double worst = 0;
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t e = expert[static_cast<std::size_t>(s)], r = s / K;
    const bool mine = e >= c.first && e < c.first + c.count;
    for (int64_t h = 0; h < H; ++h) {
      const float got = slot_out[static_cast<std::size_t>(s * H + h)];
      if (!mine) {
        CHECK(std::isnan(got));
        continue;
      }
      double y = 0;
      for (int64_t u = 0; u < U; ++u) {
        double gsum = 0, usum = 0;
        for (int64_t i = 0; i < H; ++i) {
          gsum += static_cast<double>(x[r * H + i]) * gate_up[(e * 2 * U + u) * H + i];
          usum += static_cast<double>(x[r * H + i]) * gate_up[(e * 2 * U + U + u) * H + i];
        }
        y += silu_mul(gsum, usum) * down[(e * H + h) * U + u];
      }
      worst = std::max(worst, std::abs(got - y) / std::max(1.0, std::abs(y)));
    }
  }
  CHECK(worst < 1e-5);

  // The combine from two ranks' parts: rank (expert / 4)'s part holds the slot (the other's a NaN).
  if (c.first == 0 && c.count == E) {
    std::vector<float> parts(static_cast<std::size_t>(2 * slots * H), std::nanf(""));
    for (int64_t s = 0; s < slots; ++s) {
      const int64_t owner = expert[static_cast<std::size_t>(s)] / (E / 2);
      std::copy_n(slot_out.begin() + s * H, H, parts.begin() + (owner * slots + s) * H);
    }
    Dev<float> d_parts(parts), d_out(std::vector<float>(static_cast<std::size_t>(R * H)));
    cu::moe_combine(d_parts.p, slots * H, E / 2, d_expert.p, d_weight.p, R, K, H, d_out.p, nullptr);
    const auto out = d_out.get(static_cast<std::size_t>(R * H));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t h = 0; h < H; ++h) {
        float acc = 0;  // fmaf in slot order, as the kernel: the same bits
        for (int64_t k = 0; k < K; ++k)
          acc = std::fma(weight[static_cast<std::size_t>(r * K + k)], slot_out[static_cast<std::size_t>((r * K + k) * H + h)], acc);
        CHECK(out[static_cast<std::size_t>(r * H + h)] == acc);
      }
  }
}

}  // namespace

TEST_CASE("MoE ops against host arithmetic: routing, grouping, grouped products, combine", "[gpu]") {
  SECTION("random routing, every expert local") {
    LayerCase c;
    c.rows = 37;  // 74 slots: tiles of 32 that end inside an expert's range
    c.logits = random_floats(static_cast<std::size_t>(c.rows * c.E), 7, 2.0f);
    check_layer(c);
  }
  SECTION("random routing, top 3 not renormalised (Qwen3-MoE's default)") {
    LayerCase c;
    c.rows = 20, c.K = 3, c.renormalise = false;
    c.logits = random_floats(static_cast<std::size_t>(c.rows * c.E), 10);
    check_layer(c);
  }
  SECTION("every row to the same two experts (three tiles each), the others empty") {
    LayerCase c;
    c.rows = 70;
    c.logits.assign(static_cast<std::size_t>(c.rows * c.E), 0.0f);
    for (int64_t r = 0; r < c.rows; ++r) c.logits[static_cast<std::size_t>(r * c.E + 5)] = 9, c.logits[static_cast<std::size_t>(r * c.E + 2)] = 8;
    check_layer(c);
  }
  SECTION("every expert a row chose is another rank's: this rank computes nothing") {
    LayerCase c;
    c.rows = 9, c.first = 4, c.count = 4;
    c.logits = random_floats(static_cast<std::size_t>(c.rows * c.E), 8);
    for (int64_t r = 0; r < c.rows; ++r) c.logits[static_cast<std::size_t>(r * c.E + r % 4)] = 20, c.logits[static_cast<std::size_t>(r * c.E + (r + 1) % 4)] = 19;
    check_layer(c);
  }
  SECTION("half the experts local, a row each way") {
    LayerCase c;
    c.rows = 1, c.first = 4, c.count = 4;
    c.logits = random_floats(static_cast<std::size_t>(c.E), 9);
    check_layer(c);
  }
}

TEST_CASE("MoE models (Qwen3-MoE with a dense layer, Mixtral) match the CPU engine: logits (f32 < 1e-4, bf16 < 3e-2), "
          "graphs or not; greedy tokens for 32 steps in f32; expert counts equal",
          "[gpu]") {
  const std::pair<const char*, const char*> models[] = {{"qwen3_moe", "f32"}, {"mixtral", "f32"}, {"qwen3_moe", "bf16"}};
  for (const auto& [arch, dtype] : models) {
    INFO(arch << " " << dtype);
    testing::TinyModel tiny(arch, dtype);
    REQUIRE(tiny.config.moe.any());
    auto rowmajor = ModelWeights::load(tiny.config, tiny.dir, false);
    std::mt19937 rng(3);
    std::vector<int32_t> prompt(53);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 1000);
    cpu::ThreadPool threads(2);
    kv::BlockPool cpu_pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 8);
    cpu::CpuModel cpu_model(tiny.config, *tiny.weights, cpu_pool, threads);
    const auto want = testing::chunked_logits(cpu_model, cpu_pool, prompt);
    const bool f32 = std::string(dtype) == "f32";
    for (const bool graphs : {true, false}) {
      INFO((graphs ? "decode steps as CUDA graphs" : "no graphs"));
      DevPool dev(tiny.config, 8);
      cu::CudaModel gpu(tiny.config, *rowmajor, *dev.pool);
      gpu.use_graphs(graphs);
      const auto got = testing::chunked_logits(gpu, *dev.pool, prompt);
      REQUIRE(got.size() == want.size());
      const double err = rel_err(got, want);
      std::printf("cuda %s %s%s: largest logit difference from the CPU engine %.3g (relative)\n", arch, dtype,
                  graphs ? "" : " (no graphs)", err);
      CHECK(err < (f32 ? 1e-4 : 3e-2));
      if (f32) CHECK(gpu.expert_tokens() == cpu_model.expert_tokens());
    }
    if (f32) testing::check_greedy_like_cpu(tiny, *rowmajor, 4);
  }
}
