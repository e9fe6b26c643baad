// Tensor parallelism in the CPU model (tp_group.h), ranks as threads of this
// process: the logits of a prefill and of the decode steps after it are the
// same bits at widths 1, 2 and 4 (and 8 where the heads allow), KV heads
// replicated where the width passes their count, weights in either layout;
// a mixture of experts the same bits with experts whole on their ranks
// (expert parallelism) or split, and the expert exchange on its own.
#include <catch2/catch.hpp>

#include <numeric>
#include <thread>

#include "runtime/cpu/cpu_model.h"
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
