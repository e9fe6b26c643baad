#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <random>
#include <string>

#include "common/error.h"
#include "runtime/engine/engine.h"
#include "engine_helpers.h"
#include "test_model.h"

using namespace tandem;
using namespace tandem::runtime;

using tandem::testing::random_prompt;
using tandem::testing::run_all;

namespace {


// A fresh pool and its block table for one sequence of up to n tokens.
struct Seq {
  std::vector<int32_t> tokens, blocks;
};

// Logits of every position of `target` computed alone, in chunks of `chunk`
// tokens, with KV elements of kv_bytes (4: float32, 2: bf16, 1: FP8 with row scales); with
// hidden, every position's final-normed hidden state instead (a long prompt's logits are too big).
std::vector<float> alone(const ModelConfig& c, const ModelWeights& w, const std::vector<int32_t>& target, int64_t chunk,
                         int64_t kv_bytes = 4, bool hidden = false) {
  kv::BlockPool pool({c.layers, c.kv_heads, c.head_dim, 16, kv_bytes},
                     std::max<int64_t>(64, static_cast<int64_t>(target.size() + 15) / 16));
  cpu::ThreadPool threads(2);
  cpu::CpuModel model(c, w, pool, threads);
  auto blocks = *pool.allocate(static_cast<int64_t>((target.size() + 15) / 16));
  std::vector<float> all, part;
  for (std::size_t s = 0; s < target.size(); s += static_cast<std::size_t>(chunk)) {
    cpu::SeqChunk ch;
    ch.start_pos = static_cast<int64_t>(s);
    ch.tokens = std::span<const int32_t>(target.data() + s, std::min<std::size_t>(static_cast<std::size_t>(chunk), target.size() - s));
    ch.block_table = blocks;
    ch.logits_all = !hidden;
    ch.hidden_all = hidden;
    model.forward(std::span<const cpu::SeqChunk>(&ch, 1), part);
    if (hidden) model.hidden_rows(part);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}


}  // namespace

TEST_CASE("a row's logits are bitwise the same alone, among 64 others at any position, and in any chunking",
          "[engine][invariance]") {
  // Dense, and mixtures of experts: there a batch changes which rows each expert computes, never a row's result.
  // float32, bf16 and FP8 KV (a scale per row: the row alone decides it) on the dense model; the KV element is
  // orthogonal to the experts, so they take float32.
  const auto [arch, kv_bytes] = GENERATE(table<std::string, int64_t>({{"qwen3", 4}, {"qwen3", 2}, {"qwen3", 1},
                                                                       {"qwen3_moe", 4}, {"mixtral", 4}}));
  testing::TinyModel tiny(arch, "f32");
  const auto& c = tiny.config;
  INFO(arch << ", KV element bytes " << kv_bytes);
  std::mt19937 rng(5);
  const auto target = random_prompt(rng, 40);
  const auto ref = alone(c, *tiny.weights, target, 512, kv_bytes);
  const auto V = static_cast<std::size_t>(c.vocab);

  for (int64_t chunk : {1, 7, 16, 512}) {
    INFO("prefill chunk " << chunk);
    const auto got = alone(c, *tiny.weights, target, chunk, kv_bytes);
    REQUIRE(got.size() == ref.size());
    REQUIRE(std::memcmp(got.data(), ref.data(), ref.size() * 4) == 0);
  }

  // 64 other sequences, each mid-way through its own prompt, with the target first, in the middle and last.
  for (std::size_t where : {std::size_t{0}, std::size_t{32}, std::size_t{64}}) {
    kv::BlockPool pool({c.layers, c.kv_heads, c.head_dim, 16, kv_bytes}, 65 * 8);
    cpu::ThreadPool threads(2);
    cpu::CpuModel model(c, *tiny.weights, pool, threads);
    std::vector<Seq> seqs(65);
    std::vector<cpu::SeqChunk> chunks;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].tokens = i == where ? target : random_prompt(rng, 1 + static_cast<int64_t>(rng() % 90));
      seqs[i].blocks = *pool.allocate(8);
    }
    // Fill the others' caches with an earlier step so they sit at varied positions.
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      if (i == where || seqs[i].tokens.size() < 2) continue;
      cpu::SeqChunk pre;
      pre.tokens = std::span<const int32_t>(seqs[i].tokens.data(), seqs[i].tokens.size() / 2);
      pre.block_table = seqs[i].blocks;
      std::vector<float> ignore;
      model.forward(std::span<const cpu::SeqChunk>(&pre, 1), ignore);
    }
    std::size_t target_row = 0, rows = 0;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      cpu::SeqChunk ch;
      const std::size_t start = i == where || seqs[i].tokens.size() < 2 ? 0 : seqs[i].tokens.size() / 2;
      ch.start_pos = static_cast<int64_t>(start);
      ch.tokens = std::span<const int32_t>(seqs[i].tokens.data() + start, seqs[i].tokens.size() - start);
      ch.block_table = seqs[i].blocks;
      ch.logits_all = true;
      if (i == where) target_row = rows;
      rows += ch.tokens.size();
      chunks.push_back(ch);
    }
    std::vector<float> logits;
    model.forward(chunks, logits);
    INFO("target at batch position " << where);
    REQUIRE(std::memcmp(logits.data() + target_row * V, ref.data(), ref.size() * 4) == 0);
  }
}

TEST_CASE("a long prompt's logits are the same bits whole, in chunks and token by token (taller query blocks)",
          "[engine][invariance]") {
  // Past 1,024 positions attention takes queries in blocks up to 48 tall and values in blocks of 128 rows.
  // Every position's final hidden state (its logits would be 1,300 x the vocabulary).
  testing::TinyModel tiny("qwen3", "f32");
  std::mt19937 rng(8);
  const auto target = random_prompt(rng, 1300);
  const auto ref = alone(tiny.config, *tiny.weights, target, 4096, 4, true);
  REQUIRE(ref.size() == target.size() * static_cast<std::size_t>(tiny.config.hidden));
  for (int64_t chunk : {1, 5, 600}) {
    INFO("prefill chunk " << chunk);
    const auto got = alone(tiny.config, *tiny.weights, target, chunk, 4, true);
    REQUIRE(got.size() == ref.size());
    REQUIRE(std::memcmp(got.data(), ref.data(), ref.size() * 4) == 0);
  }
}

TEST_CASE("bf16 KV: half the pool, logits within bf16 rounding of float32 KV's", "[engine][kv]") {
  testing::TinyModel tiny;
  const auto& c = tiny.config;
  REQUIRE(kv::KvLayout{c.layers, c.kv_heads, c.head_dim, 16, 2}.block_bytes() * 2 ==
          kv::KvLayout{c.layers, c.kv_heads, c.head_dim, 16, 4}.block_bytes());
  std::mt19937 rng(3);
  const auto target = random_prompt(rng, 40);
  const auto f32 = alone(c, *tiny.weights, target, 16, 4);
  const auto bf16 = alone(c, *tiny.weights, target, 16, 2);
  REQUIRE(f32.size() == bf16.size());
  // Each row against its own scale: bf16 keeps 8 bits of mantissa (0.4%
  // relative per element); measured 0.2% on this model.
  const auto V = static_cast<std::size_t>(c.vocab);
  double worst = 0;
  for (std::size_t r = 0; r < target.size(); ++r) {
    double diff = 0, scale = 0;
    for (std::size_t j = 0; j < V; ++j) {
      diff = std::max(diff, static_cast<double>(std::fabs(f32[r * V + j] - bf16[r * V + j])));
      scale = std::max(scale, static_cast<double>(std::fabs(f32[r * V + j])));
    }
    worst = std::max(worst, diff / scale);
  }
  INFO("worst row difference / row scale " << worst);
  CHECK(worst > 0);     // bf16 is really used
  CHECK(worst < 0.05);  // and is close to float32
}

TEST_CASE("generated tokens do not depend on what else is running", "[engine][invariance]") {
  const std::string arch = GENERATE("qwen3", "qwen3_moe");
  INFO(arch);
  testing::TinyModel tiny(arch, "f32");
  std::mt19937 rng(9);
  const auto target = random_prompt(rng, 23);
  auto generate = [&](int64_t others, int64_t max_batched_tokens) {
    kv::BlockPool pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 1024);
    cpu::ThreadPool threads(2);
    Engine e(tiny.config, *tiny.weights, pool, threads, nullptr, {64, max_batched_tokens, 0});
    std::mt19937 r2(1);
    for (int64_t i = 0; i < others; ++i) {
      EngineRequest q{static_cast<uint64_t>(100 + i), random_prompt(r2, 5 + static_cast<int64_t>(r2() % 60)), {}, 7};
      q.params.max_tokens = 1 + static_cast<int64_t>(r2() % 30);
      e.add(q);
    }
    EngineRequest t{1, target, {}, 42};
    t.params.max_tokens = 24;
    t.params.temperature = 0.8f;  // sampled, not greedy: the counter-based generator is tested too
    t.params.ignore_eos = true;
    e.add(t);
    return run_all(e).at(1).tokens;
  };
  const auto ref = generate(0, 2048);
  CHECK(ref.size() == 24);
  CHECK(generate(40, 2048) == ref);
  CHECK(generate(40, 19) == ref);  // small token budget: chunked prefill mixed with decodes
}

TEST_CASE("out of KV blocks: sequences are preempted and recomputed, outputs unchanged", "[engine][preemption]") {
  testing::TinyModel tiny;
  std::mt19937 rng(13);
  std::vector<EngineRequest> reqs;
  for (uint64_t i = 0; i < 12; ++i) {
    EngineRequest q{i, random_prompt(rng, 20 + static_cast<int64_t>(rng() % 20)), {}, 1000 + i};
    q.params.max_tokens = 40;
    q.params.ignore_eos = true;
    q.params.temperature = i % 2 ? 0.0f : 1.0f;
    reqs.push_back(q);
  }
  auto run = [&](int64_t blocks, EngineStats& stats) {
    kv::BlockPool pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, blocks);
    cpu::ThreadPool threads(2);
    Engine e(tiny.config, *tiny.weights, pool, threads, nullptr, {64, 512, 0});
    for (const auto& r : reqs) e.add(r);
    auto out = run_all(e);
    stats = e.stats();
    CHECK(pool.num_free() == blocks);  // every block came back
    return out;
  };
  EngineStats big, small;
  const auto ref = run(1024, big);
  const auto tight = run(10, small);  // 160 tokens of KV for 12 sequences of up to 80
  CHECK(big.preemptions == 0);
  CHECK(small.preemptions > 0);
  REQUIRE(tight.size() == reqs.size());
  for (const auto& r : reqs) {
    INFO("request " << r.id);
    CHECK(tight.at(r.id).tokens == ref.at(r.id).tokens);
    CHECK(tight.at(r.id).tokens.size() == 40);
  }
}

TEST_CASE("the prefix cache skips shared prefixes and changes no output", "[engine][prefix]") {
  testing::TinyModel tiny;
  std::mt19937 rng(21);
  const auto shared = random_prompt(rng, 70);
  std::vector<EngineRequest> reqs;
  for (uint64_t i = 0; i < 8; ++i) {
    auto p = shared;
    const auto tail = random_prompt(rng, 3 + static_cast<int64_t>(i));
    p.insert(p.end(), tail.begin(), tail.end());
    EngineRequest q{i, p, {}, 50 + i};
    q.params.max_tokens = 10;
    q.params.ignore_eos = true;
    q.params.temperature = i % 2 ? 0.0f : 0.7f;
    reqs.push_back(q);
  }
  auto run = [&](bool caching, EngineStats& stats) {
    kv::BlockPool pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 256);
    cpu::ThreadPool threads(2);
    EngineOptions opt{4, 64, 0, caching};
    Engine e(tiny.config, *tiny.weights, pool, threads, nullptr, opt);
    for (const auto& r : reqs) e.add(r);
    auto out = run_all(e);
    stats = e.stats();
    return out;
  };
  EngineStats with, without;
  const auto a = run(true, with), b = run(false, without);
  CHECK(with.prefix_hit_tokens >= 4 * 7 * 16);  // later requests reuse the 4 shared full blocks
  CHECK(without.prefix_hit_tokens == 0);
  CHECK(with.prefill_tokens < without.prefill_tokens);
  for (const auto& r : reqs) CHECK(a.at(r.id).tokens == b.at(r.id).tokens);
}

// Requests arriving together with a shared prefix: the first computes it, the
// others wait one step for its blocks instead of computing them in parallel.
TEST_CASE("a prefix shared by requests admitted together is computed once", "[engine][prefix]") {
  testing::TinyModel tiny;
  std::mt19937 rng(22);
  const auto shared = random_prompt(rng, 96);  // six full blocks
  std::vector<EngineRequest> reqs;
  int64_t tails = 0;
  for (uint64_t i = 0; i < 8; ++i) {
    auto p = shared;
    const auto tail = random_prompt(rng, 5 + static_cast<int64_t>(i));
    tails += static_cast<int64_t>(tail.size());
    p.insert(p.end(), tail.begin(), tail.end());
    EngineRequest q{i, p, {}, 70 + i};
    q.params.max_tokens = 4;
    q.params.ignore_eos = true;
    reqs.push_back(q);
  }
  auto run = [&](bool caching, EngineStats& stats) {
    kv::BlockPool pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 256);
    cpu::ThreadPool threads(2);
    Engine e(tiny.config, *tiny.weights, pool, threads, nullptr, EngineOptions{16, 2048, 0, caching});
    for (const auto& r : reqs) e.add(r);  // all fit in the first step's token budget
    auto out = run_all(e);
    stats = e.stats();
    return out;
  };
  EngineStats with, without;
  const auto a = run(true, with), b = run(false, without);
  CHECK(with.prefill_tokens == 96 + tails);
  CHECK(with.prefix_hit_tokens == 7 * 96);
  CHECK(without.prefill_tokens == 8 * 96 + tails);
  for (const auto& r : reqs) CHECK(a.at(r.id).tokens == b.at(r.id).tokens);
}

TEST_CASE("sampling options: stop tokens, stop strings, max_tokens, logprobs, prompt logprobs", "[engine][sampling]") {
  testing::TinyModel tiny;
  auto tok = Tokenizer::load(tiny.dir);
  kv::BlockPool pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 256);
  cpu::ThreadPool threads(2);
  Engine e(tiny.config, *tiny.weights, pool, threads, tok.get(), {8, 256, 0});
  const auto prompt = tok->encode("The quick brown fox", false);

  EngineRequest greedy{1, prompt, {}, 0};
  greedy.params.temperature = 0;
  greedy.params.max_tokens = 12;
  greedy.params.ignore_eos = true;
  greedy.params.logprobs = 3;
  greedy.params.prompt_logprobs = 2;
  e.add(greedy);
  auto out = run_all(e).at(1);
  REQUIRE(out.tokens.size() == 12);
  CHECK(out.reason == FinishReason::kLength);
  REQUIRE(out.logprobs.size() == 12);
  for (std::size_t i = 0; i < 12; ++i) {
    CHECK(out.logprobs[i].chosen.token == out.tokens[i]);
    REQUIRE(out.logprobs[i].top.size() == 3);
    CHECK(out.logprobs[i].top[0].token == out.tokens[i]);  // greedy picks the most likely
    CHECK(out.logprobs[i].chosen.logprob <= 0.0f);
  }
  REQUIRE(out.prompt_logprobs.size() == prompt.size() - 1);
  CHECK(out.prompt_logprobs[0].chosen.token == prompt[1]);
  CHECK(out.text == tok->decode(out.tokens, true));

  // Stop at the third generated token, by id and by string.
  EngineRequest by_id = greedy;
  by_id.id = 2;
  by_id.params.stop_token_ids = {out.tokens[2]};
  e.add(by_id);
  auto stopped = run_all(e).at(2);
  CHECK(stopped.reason == FinishReason::kStop);
  CHECK(stopped.tokens == std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + 3));

  const std::string third = tok->decode(std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + 3), true);
  const std::string first_two = tok->decode(std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + 2), true);
  if (third.size() > first_two.size() && out.text.find(third.substr(first_two.size())) == first_two.size()) {
    EngineRequest by_text = greedy;
    by_text.id = 3;
    by_text.params.stop = {third.substr(first_two.size())};
    e.add(by_text);
    auto s = run_all(e).at(3);
    CHECK(s.reason == FinishReason::kStop);
    CHECK(s.text == first_two);  // the stop string itself is not in the output
  }

  // Same seed, same draws; another seed, other draws.
  auto sample = [&](uint64_t id, uint64_t key) {
    EngineRequest r{id, prompt, {}, key};
    r.params.temperature = 1.5f;
    r.params.max_tokens = 16;
    r.params.ignore_eos = true;
    e.add(r);
    return run_all(e).at(id).tokens;
  };
  CHECK(sample(10, 77) == sample(11, 77));
  CHECK(sample(12, 77) != sample(13, 78));
}

// A decode rank's sequence whose KV a prefill rank sent, preempted for lack
// of blocks, finds its own blocks in the prefix cache when it comes back:
// that is recomputation saved, not a prefix hit of the request (the prefill
// rank counted those), so prefix_hit_rate cannot pass 1.
TEST_CASE("prefix hits count once per request, not again after a preemption", "[engine][prefix][preemption]") {
  testing::TinyModel tiny;
  std::mt19937 rng(31);
  kv::BlockPool pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 10);
  cpu::ThreadPool threads(2);
  Engine e(tiny.config, *tiny.weights, pool, threads, nullptr, {8, 256, 0});
  for (uint64_t i = 0; i < 3; ++i) {
    EngineRequest q{i, random_prompt(rng, 48), {}, 90 + i};  // 3 full blocks each
    q.params.max_tokens = 40;
    q.params.ignore_eos = true;
    auto blocks = e.reserve_blocks(48);
    REQUIRE(blocks);
    e.add_prefilled(q, *blocks, PrefillHandoff{7, {}, {}}, std::chrono::steady_clock::now());
  }
  const auto out = run_all(e);
  CHECK(out.size() == 3);
  CHECK(e.stats().preemptions > 0);  // 3 x 88 tokens of KV in 160: someone came back
  CHECK(e.stats().prefix_hit_tokens == 0);
}

TEST_CASE("logit_bias: the tokens of a plain greedy or sampled draw over the biased logits, alone or batched",
          "[engine][sampling][invariance]") {
  testing::TinyModel tiny;
  std::mt19937 rng(41);
  const auto target = random_prompt(rng, 30);
  auto generate = [&](const SamplingParams& params, int64_t others) {
    kv::BlockPool pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 1024);
    cpu::ThreadPool threads(2);
    Engine e(tiny.config, *tiny.weights, pool, threads, nullptr, {64, 2048, 0});
    std::mt19937 r2(3);
    for (int64_t i = 0; i < others; ++i) {
      EngineRequest q{static_cast<uint64_t>(100 + i), random_prompt(r2, 5 + static_cast<int64_t>(r2() % 40)), {}, 7};
      q.params.max_tokens = 1 + static_cast<int64_t>(r2() % 20);
      e.add(q);
    }
    e.add(EngineRequest{1, target, params, 42});
    return run_all(e).at(1).tokens;
  };
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 12;
  greedy.ignore_eos = true;
  const auto plain = generate(greedy, 0);
  // Banning each token greedy chose first moves the draw elsewhere; forcing one token takes every step.
  SamplingParams banned = greedy;
  banned.logit_bias = {{plain[0], -100.0f}};
  const auto b = generate(banned, 0);
  CHECK(b[0] != plain[0]);
  CHECK(std::find(b.begin(), b.end(), plain[0]) == b.end());
  CHECK(generate(banned, 30) == b);
  SamplingParams forced = greedy;
  forced.logit_bias = {{5, 100.0f}};
  CHECK(generate(forced, 0) == std::vector<int32_t>(12, 5));
  // Sampled, with a mild bias: the same alone and among 30 others.
  SamplingParams sampled = greedy;
  sampled.temperature = 0.9f;
  sampled.logit_bias = {{plain[1], 2.5f}, {plain[2], -1.0f}, {17, 4.0f}};
  const auto alone = generate(sampled, 0);
  CHECK(generate(sampled, 30) == alone);
  CHECK(alone != generate([&] { auto p = sampled; p.logit_bias.clear(); return p; }(), 0));
}

TEST_CASE("min_tokens: no stop token, EOS or stop string ends the output before it", "[engine][sampling]") {
  testing::TinyModel tiny;
  auto tok = Tokenizer::load(tiny.dir);
  std::mt19937 rng(43);
  const auto prompt = random_prompt(rng, 20);
  auto generate = [&](const SamplingParams& params, int64_t others) {
    kv::BlockPool pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 1024);
    cpu::ThreadPool threads(2);
    Engine e(tiny.config, *tiny.weights, pool, threads, tok.get(), {64, 2048, 0});
    std::mt19937 r2(5);
    for (int64_t i = 0; i < others; ++i) {
      EngineRequest q{static_cast<uint64_t>(100 + i), random_prompt(r2, 5 + static_cast<int64_t>(r2() % 40)), {}, 7};
      q.params.max_tokens = 1 + static_cast<int64_t>(r2() % 20);
      e.add(q);
    }
    e.add(EngineRequest{1, prompt, params, 42});
    return run_all(e).at(1);
  };
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 16;
  greedy.ignore_eos = true;
  const auto plain = generate(greedy, 0).tokens;
  // Stopping on greedy's second token: without min_tokens it ends at 2 tokens.
  SamplingParams stop = greedy;
  stop.stop_token_ids = {plain[1]};
  CHECK(generate(stop, 0).tokens.size() == 2);
  SamplingParams held = stop;
  held.min_tokens = 6;
  const auto h = generate(held, 0);
  REQUIRE(h.tokens.size() >= 6);
  // The reference: the first six tokens are greedy's with the stop token banned (logit_bias -inf-like).
  SamplingParams reference = greedy;
  reference.max_tokens = 6;
  reference.logit_bias = {{plain[1], -100.0f}};
  const auto ref = generate(reference, 0).tokens;
  CHECK(std::vector<int32_t>(h.tokens.begin(), h.tokens.begin() + 6) == ref);
  CHECK(generate(held, 30).tokens == h.tokens);
  if (h.reason == FinishReason::kStop) CHECK(h.tokens.back() == plain[1]);
  // EOS is held back too (unless ignore_eos): the model's EOS forced by a bias cannot end it before 4 tokens.
  SamplingParams eos = greedy;
  eos.ignore_eos = false;
  eos.logit_bias = {{tiny.config.eos_token_ids.at(0), 100.0f}};
  CHECK(generate(eos, 0).tokens.size() == 1);
  eos.min_tokens = 4;
  const auto e4 = generate(eos, 0);
  CHECK(e4.tokens.size() == 5);
  CHECK(e4.reason == FinishReason::kStop);
  // A stop string met before min_tokens does not end the output.
  const std::string text = generate(greedy, 0).text;
  const std::string two = tok->decode(std::vector<int32_t>(plain.begin(), plain.begin() + 2), true);
  if (two.size() >= 2 && text.find(two) == 0 && text.find(two, 1) == std::string::npos) {
    SamplingParams by_text = greedy;
    by_text.stop = {two};
    CHECK(generate(by_text, 0).text.empty());
    by_text.min_tokens = 3;
    CHECK(generate(by_text, 0).text == text);  // never met again: runs to max_tokens
  }
}

TEST_CASE("requests the engine cannot serve are refused with one line", "[engine][errors]") {
  testing::TinyModel tiny;
  kv::BlockPool pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16}, 4);
  cpu::ThreadPool threads(1);
  Engine e(tiny.config, *tiny.weights, pool, threads, nullptr, {8, 256, 100});
  EngineRequest r{1, {}, {}, 0};
  CHECK_THROWS_WITH(e.add(r), "request 1: the prompt is empty");
  r.prompt = std::vector<int32_t>(150, 5);
  CHECK_THROWS_WITH(e.add(r), "request 1: the prompt has 150 tokens but the context holds 100 (shorten the prompt or "
                              "raise model.max_model_len)");
  r.prompt = {1, 2, 999999999};
  CHECK_THROWS_WITH(e.add(r), Catch::Contains("token id 999999999 is outside the vocabulary"));
  r.prompt = std::vector<int32_t>(60, 5);
  r.params.max_tokens = 30;
  CHECK_THROWS_WITH(e.add(r), Catch::Contains("needs up to 90 tokens of KV cache but the pool holds 64"));
  // A prefill-only request (a prefill rank's) needs room for its prompt and one token only.
  r.prefill_only = true;
  CHECK_NOTHROW(e.check(r));
  r.prefill_only = false;
  r.params.max_tokens = 2;
  r.params.stop_token_ids = {99999999};
  CHECK_THROWS_WITH(e.add(r), Catch::Contains("stop_token_ids has 99999999, outside the vocabulary"));
  CHECK_FALSE(e.has_work());
}

namespace {

// A backend that "draws where the logits are" (here on the host, from the
// DeviceDraw it is given, as the CUDA backend's draw kernel does), so the
// engine's forward_draw path can be held to its sample_token path.
class DrawingBackend : public ModelBackend {
 public:
  DrawingBackend(const ModelConfig& c, const ModelWeights& w, kv::BlockPool& pool, cpu::ThreadPool& threads)
      : inner_(c, w, pool, threads), vocab_(c.vocab) {}
  std::string_view name() const override { return "drawing"; }
  void forward(std::span<const SeqChunk> chunks, std::vector<float>& logits) override { inner_.forward(chunks, logits); }
  bool forward_draw(std::span<const SeqChunk> chunks, std::span<const DeviceDraw> draws,
                    std::vector<int32_t>& tokens) override {
    std::vector<float> logits;
    inner_.forward(chunks, logits);
    REQUIRE(logits.size() == draws.size() * static_cast<std::size_t>(vocab_));
    tokens.clear();
    for (std::size_t r = 0; r < draws.size(); ++r)
      tokens.push_back(draw(std::span<const float>(logits.data() + r * static_cast<std::size_t>(vocab_),
                                                   static_cast<std::size_t>(vocab_)),
                            draws[r]));
    ++draw_steps;
    return true;
  }
  int draw_steps = 0;

 private:
  // Inverse CDF in id order over exp((logit - max) / T), min-p applied; greedy at T = 0.
  static int32_t draw(std::span<const float> row, const DeviceDraw& d) {
    const auto best = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    if (d.temperature <= 1e-5f) return best;
    const float max = row[static_cast<std::size_t>(best)], inv_t = 1.0f / d.temperature;
    std::vector<double> w(row.size());
    double mass = 0;
    for (std::size_t i = 0; i < row.size(); ++i) {
      const float x = (row[i] - max) * inv_t;
      w[i] = x > -48.0f ? std::exp(static_cast<double>(x)) : 0.0;
      if (d.min_p > 0 && w[i] < d.min_p) w[i] = 0;
      mass += w[i];
    }
    double c = 0;
    int32_t last = 0;  // as the host: past the end, the last token with a weight (0 when none has one)
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (w[i] == 0) continue;
      last = static_cast<int32_t>(i);
      if (d.u * mass < (c += w[i])) return last;
    }
    return last;
  }
  cpu::CpuModel inner_;
  int64_t vocab_;
};

}  // namespace

TEST_CASE("greedy and plain-temperature steps drawn by the backend give sample_token's tokens", "[engine][sampling]") {
  testing::TinyModel tiny;
  std::mt19937 rng(21);
  std::vector<EngineRequest> reqs;
  for (uint64_t i = 0; i < 6; ++i) {
    EngineRequest r{i, random_prompt(rng, 5 + 3 * static_cast<int64_t>(i)), {}, 1000 + i};
    r.params.max_tokens = 12;
    r.params.ignore_eos = true;
    r.params.temperature = i == 0 ? 0.0f : 0.6f + 0.2f * static_cast<float>(i % 3);
    r.params.min_p = i % 2 ? 0.05f : 0.0f;
    reqs.push_back(r);
  }
  auto run = [&](Engine& e) { return testing::run_to_end(e, reqs); };
  const kv::KvLayout layout{tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16};
  cpu::ThreadPool threads(2);
  kv::BlockPool host_pool(layout, 64), draw_pool(layout, 64);
  Engine host(tiny.config, *tiny.weights, host_pool, threads, nullptr, EngineOptions{8, 64, 0, true});
  auto backend = std::make_unique<DrawingBackend>(tiny.config, *tiny.weights, draw_pool, threads);
  DrawingBackend* drawing = backend.get();
  Engine device(tiny.config, std::move(backend), draw_pool, nullptr, EngineOptions{8, 64, 0, true});
  const auto want = run(host), got = run(device);
  CHECK(drawing->draw_steps > 0);
  for (const auto& [id, tokens] : want) {
    INFO("request " << id);
    CHECK(got.at(id) == tokens);
  }
  // A top-p request is not drawn on the device: its steps go through forward().
  drawing->draw_steps = 0;
  EngineRequest topp{99, random_prompt(rng, 7), {}, 7};
  topp.params.max_tokens = 4;
  topp.params.temperature = 0.8f;
  topp.params.top_p = 0.9f;
  topp.params.ignore_eos = true;
  device.add(topp);
  while (device.has_work()) device.step();
  CHECK(drawing->draw_steps == 0);
}
