#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "engine_helpers.h"
#include "runtime/cpu/cpu_model.h"
#include "runtime/engine/engine.h"
#include "test_model.h"

using namespace tandem;
using namespace tandem::runtime;
using tandem::testing::random_prompt;
using tandem::testing::run_all;

TEST_CASE("embeddings: the pooled final-normed hidden state, the same bits alone, chunked, batched and cached",
          "[engine][embeddings]") {
  testing::TinyModel tiny("qwen3", "f32");
  const auto& c = tiny.config;
  const auto H = static_cast<std::size_t>(c.hidden);
  std::mt19937 rng(13);
  const auto prompt = random_prompt(rng, 37);
  // The reference: one forward over the whole prompt, every row's hidden state.
  std::vector<float> rows;
  {
    kv::BlockPool pool({c.layers, c.kv_heads, c.head_dim, 16}, 8);
    cpu::ThreadPool threads(1);
    cpu::CpuModel model(c, *tiny.weights, pool, threads);
    auto blocks = *pool.allocate(3);
    SeqChunk ch;
    ch.tokens = prompt;
    ch.block_table = blocks;
    ch.hidden_all = true;
    std::vector<float> logits;
    model.forward({&ch, 1}, logits);
    CHECK(logits.empty());  // no LM head for hidden rows
    REQUIRE(model.hidden_rows(rows));
    REQUIRE(rows.size() == prompt.size() * H);
  }
  std::vector<float> last(rows.end() - static_cast<std::ptrdiff_t>(H), rows.end()), first(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(H)),
      mean(H, 0.0f);
  for (std::size_t t = 0; t < prompt.size(); ++t)
    for (std::size_t j = 0; j < H; ++j) mean[j] += rows[t * H + j];
  for (float& v : mean) v /= static_cast<float>(prompt.size());

  auto embed = [&](Pooling pooling, int64_t others, int64_t max_batched_tokens, int repeats) {
    kv::BlockPool pool({c.layers, c.kv_heads, c.head_dim, 16}, 512);
    cpu::ThreadPool threads(2);
    Engine e(c, *tiny.weights, pool, threads, nullptr, {64, max_batched_tokens, 0});
    std::mt19937 r2(3);
    for (int64_t i = 0; i < others; ++i) {  // generations and other embeddings alongside
      EngineRequest q{static_cast<uint64_t>(100 + i), random_prompt(r2, 5 + static_cast<int64_t>(r2() % 60)), {}, 7};
      q.params.max_tokens = 1 + static_cast<int64_t>(r2() % 20);
      if (i % 3 == 0) q.pooling = Pooling::kMean;
      e.add(q);
    }
    std::vector<std::vector<float>> got;
    for (int k = 0; k < repeats; ++k) {  // again after the first: its blocks are in the prefix cache then
      EngineRequest t{static_cast<uint64_t>(1 + k), prompt, {}, 0};
      t.pooling = pooling;
      e.add(t);
      auto done = run_all(e);
      const EngineOutput& o = done.at(static_cast<uint64_t>(1 + k));
      CHECK(o.tokens.empty());
      CHECK(o.prompt_tokens == static_cast<int64_t>(prompt.size()));
      got.push_back(o.embedding);
    }
    CHECK(e.stats().decode_tokens <= others * 20);  // the embeddings decoded nothing
    return got;
  };
  for (auto [pooling, want] : {std::pair{Pooling::kLast, &last}, std::pair{Pooling::kMean, &mean},
                               std::pair{Pooling::kCls, &first}}) {
    INFO("pooling " << static_cast<int>(pooling));
    for (auto [others, budget] : {std::pair<int64_t, int64_t>{0, 2048}, {0, 7}, {30, 2048}, {30, 11}}) {
      INFO(others << " other requests, " << budget << " tokens a step");
      for (const auto& v : embed(pooling, others, budget, 2)) {
        REQUIRE(v.size() == H);
        CHECK(std::memcmp(v.data(), want->data(), H * 4) == 0);
      }
    }
  }
}

