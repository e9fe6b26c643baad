// Tensor parallelism in the CPU model (tp_group.h), ranks as threads of this
// process: the logits of a prefill and of the decode steps after it are the
// same bits at widths 1, 2 and 4 (and 8 where the heads allow), KV heads
// replicated where the width passes their count, weights in either layout;
// a mixture of experts the same bits with experts whole on their ranks
// (expert parallelism) or split, the expert exchange on its own, and the
// routing's arithmetic.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "runtime/cpu/cpu_model.h"
#include "runtime/cpu/expert_parallel.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/row_parallel.h"
#include "runtime/cpu/tp_group.h"
#include "test_model.h"
#include "expert_exchange.h"
#include "thread_group.h"
#include "tp_forward.h"

using namespace tandem;
using namespace tandem::runtime;
using namespace tandem::runtime::cpu;

namespace {

using tandem::testing::ThreadGroup;

std::vector<float> run_group(const ModelConfig& c, const ModelWeights& w, int width, const std::vector<int32_t>& prompt,
                             int steps, bool expert_parallel = true, int64_t kv_elem_bytes = 4) {
  if (width == 1) return testing::tp_forward(c, w, nullptr, prompt, steps, true, kv_elem_bytes);
  ThreadGroup g(width);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(width));
  std::vector<std::thread> ranks;
  for (int r = 0; r < width; ++r)
    ranks.emplace_back([&, r] {
      ThreadGroup::Member m(g, r);
      out[static_cast<std::size_t>(r)] = testing::tp_forward(c, w, &m, prompt, steps, expert_parallel, kv_elem_bytes);
    });
  for (auto& t : ranks) t.join();
  for (int r = 1; r < width; ++r) REQUIRE(out[static_cast<std::size_t>(r)] == out[0]);  // every rank: the same logits
  return out[0];
}

}  // namespace

TEST_CASE("tensor parallel: the logits are the same bits at every width", "[tp]") {
  std::vector<int32_t> prompt(21);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(100 + 37 * i);
  for (const std::string dtype : {"f32", "bf16"}) {
    testing::TinyModel tiny("qwen3", dtype);  // 4 heads, 2 KV heads: width 4 replicates each KV head twice
    const auto rowmajor = ModelWeights::load(tiny.config, tiny.dir, /*panels=*/false);
    const auto reference = run_group(tiny.config, *tiny.weights, 1, prompt, 4);
    REQUIRE(reference.size() == (prompt.size() + 4) * static_cast<std::size_t>(tiny.config.vocab));
    for (int width : {1, 2, 4}) {
      for (const ModelWeights* w : {tiny.weights.get(), rowmajor.get()}) {
        INFO("weights " << dtype << (w->panels ? " in panels" : " row-major") << ", width " << width);
        const auto got = run_group(tiny.config, *w, width, prompt, 4);
        REQUIRE(got.size() == reference.size());
        CHECK(std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("tensor parallel with FP8 KV: the same bits at every width, other bits than float32 KV", "[tp][kv]") {
  std::vector<int32_t> prompt(21);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(100 + 37 * i);
  testing::TinyModel tiny("qwen3", "bf16");
  const auto f32_kv = run_group(tiny.config, *tiny.weights, 1, prompt, 4);
  const auto reference = run_group(tiny.config, *tiny.weights, 1, prompt, 4, true, 1);
  CHECK(reference != f32_kv);  // the KV really is FP8
  for (int width : {2, 4}) {
    INFO("width " << width);
    const auto got = run_group(tiny.config, *tiny.weights, width, prompt, 4, true, 1);
    CHECK(std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("tensor parallel: widths that cannot shard the model are refused with the reason", "[tp]") {
  testing::TinyModel tiny;  // 4 heads, 2 KV heads
  CHECK(tp_problem(tiny.config, 1).empty());
  CHECK(tp_problem(tiny.config, 4).empty());
  CHECK(tp_problem(tiny.config, 8) == "a width of 8 does not divide the model's 4 attention heads");
  CHECK(tp_problem(tiny.config, 3) == "a tensor-parallel width is 1, 2, 4 or 8, not 3");
}

TEST_CASE("expert parallel: a mixture of experts' logits are the same bits at every width, experts whole or split",
          "[tp][moe]") {
  std::vector<int32_t> prompt(21);  // 21 rows: home blocks of 5 and 6 at width 4
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(100 + 37 * i);
  for (const std::string arch : {"qwen3_moe", "mixtral"}) {
    testing::TinyModel tiny(arch, "bf16");  // 8 experts, top 2 (Qwen3-MoE: layer 0 dense)
    const auto rowmajor = ModelWeights::load(tiny.config, tiny.dir, /*panels=*/false);
    const auto reference = run_group(tiny.config, *tiny.weights, 1, prompt, 4);
    for (int width : {2, 4})
      for (bool whole : {true, false}) {
        INFO(arch << ", width " << width << (whole ? ", experts whole" : ", experts split"));
        auto got = run_group(tiny.config, *rowmajor, width, prompt, 4, whole);
        REQUIRE(got.size() == reference.size());
        CHECK(std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)) == 0);
      }
  }
}

TEST_CASE("expert parallel: the combine exchange moves every slot to its row's home rank", "[tp][moe]") {
  for (int width : {1, 2, 4, 8})
    for (const auto& c : testing::exchange_cases(width)) {
      ThreadGroup g(width);
      std::vector<std::string> why(static_cast<std::size_t>(width));
      std::vector<std::thread> ranks;
      for (int r = 0; r < width; ++r)
        ranks.emplace_back([&, r] {
          ThreadGroup::Member m(g, r);
          why[static_cast<std::size_t>(r)] = testing::check_exchange(m, c);
        });
      for (auto& t : ranks) t.join();
      for (const auto& w : why) CHECK(w == "");
    }
}

TEST_CASE("expert parallel: a width that does not divide the experts is refused, unless experts are split", "[tp][moe]") {
  testing::TinyModel tiny("qwen3_moe");
  CHECK(tp_problem(tiny.config, 4).empty());
  ModelConfig six = tiny.config;
  six.moe.experts = 6;
  CHECK(tp_problem(six, 2).empty());
  CHECK(tp_problem(six, 4) ==
        "a width of 4 does not divide the model's 6 experts (expert parallelism gives each rank whole experts): choose a "
        "width that divides them, or set cluster.expert_parallel = false to split every expert across the ranks instead");
  CHECK(tp_problem(six, 4, /*expert_parallel=*/false).empty());
}

TEST_CASE("expert routing: a float32 softmax on exp_fixed, the top k by probability (ties to the lower id)", "[moe]") {
  constexpr int64_t E = 64, K = 4, R = 16;
  std::mt19937 gen(7);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::vector<float> logits(static_cast<std::size_t>(R * E));
  for (auto& v : logits) v = logit(gen);
  logits[5 * E + 9] = logits[5 * E + 3] = 40.0f;  // row 5: a tie at the top, expert 3 first
  logits[6 * E + 7] = logits[6 * E + 2] = -30.0f;  // row 6: every expert equal but two (a tie for slots 0-3)
  for (int64_t e = 0; e < E; ++e)
    if (e != 7 && e != 2) logits[static_cast<std::size_t>(6 * E + e)] = 1.5f;
  for (bool renormalise : {false, true}) {
    INFO("renormalise " << renormalise);
    std::vector<float> probs = logits, weight(static_cast<std::size_t>(R * K));
    std::vector<int32_t> expert(static_cast<std::size_t>(R * K));
    route_rows(probs.data(), R, E, K, renormalise, expert.data(), weight.data());
    for (int64_t r = 0; r < R; ++r) {
      INFO("row " << r);
      const float* l = logits.data() + r * E;
      const float max = *std::max_element(l, l + E);
      std::vector<float> p(static_cast<std::size_t>(E));
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (p[static_cast<std::size_t>(e)] = exp_fixed(l[e] - max));
      for (auto& v : p) v /= sum;
      CHECK(std::memcmp(p.data(), probs.data() + r * E, sizeof(float) * E) == 0);
      std::vector<int32_t> order(static_cast<std::size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
      float chosen = 0;
      for (int64_t k = 0; k < K; ++k) chosen += p[static_cast<std::size_t>(order[k])];
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = order[static_cast<std::size_t>(k)];
        CHECK(expert[static_cast<std::size_t>(r * K + k)] == e);
        const float w = renormalise ? p[static_cast<std::size_t>(e)] / chosen : p[static_cast<std::size_t>(e)];
        CHECK(std::memcmp(&w, &weight[static_cast<std::size_t>(r * K + k)], sizeof w) == 0);
      }
    }
    CHECK(std::vector<int32_t>(expert.begin() + 5 * K, expert.begin() + 5 * K + 2) == std::vector<int32_t>{3, 9});
    CHECK(std::vector<int32_t>(expert.begin() + 6 * K, expert.begin() + 7 * K) == std::vector<int32_t>{0, 1, 3, 4});
  }
}
