// Structured outputs' cost, measured in one run against the same work without.
//
//   grammar_bench [--model DIR] [--threads N] [--steps N]
//
// Without --model it uses the engine bench's model (Qwen3-0.6B's shape, bf16,
// Qwen3's real 151,669-token vocabulary; made under build/bench-model once).
// Prints: the vocabulary's byte table (once per worker); a typical extraction
// schema's conversion and compilation, first and from the cache; the token
// mask per step on random walks through it, cold (each automaton node's token
// sets computed on first use) and warm; and decode tokens/s at 32 sequences
// sampling under the schema against the same 32 without it, with the ratio
// (goal: under 10% slower). Figures only: it never fails on time.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "grammar/grammar_cache.h"
#include "grammar/json_schema.h"
#include "runtime/engine/engine.h"
#include "perf/bench_model.h"
#include "runtime/model/weights.h"
#include "runtime/tokenizer/tokenizer.h"

using namespace tandem;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

const char* const kSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":40},
  "age":{"type":"integer","minimum":0,"maximum":130},
  "email":{"type":"string","format":"email"},
  "role":{"enum":["admin","editor","viewer"]},
  "tags":{"type":"array","items":{"type":"string","maxLength":16},"maxItems":5},
  "address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},
             "required":["city"]},
  "active":{"type":"boolean"}},
  "required":["name","age","role","active"]})";


// Decode tokens/s of n sequences sampled at temperature 1, with or without the schema; only steps
// that decode all n count (a schema's output may end before max_tokens). Two rounds of n on one engine: the first warms the
// schema's token sets (reported as its own figure), the second is timed.
struct Decode {
  double warmup_s = 0;  // the first round's wall time
  double tokens_per_s = 0;
};

Decode decode(const runtime::ModelConfig& c, const runtime::ModelWeights& w, const runtime::Tokenizer& tok,
              runtime::cpu::ThreadPool& threads, int64_t n, int64_t steps, const std::string& grammar) {
  kv::BlockPool pool({c.layers, c.kv_heads, c.head_dim, 16}, n * ((32 + steps + 16) / 16 + 1));
  runtime::Engine e(c, w, pool, threads, &tok, {n, 4096, 0});
  std::mt19937 rng(1);
  Decode out;
  for (int round = 0; round < 2; ++round) {
    for (int64_t i = 0; i < n; ++i) {
      runtime::EngineRequest r{static_cast<uint64_t>(round * n + i), {}, {}, static_cast<uint64_t>(round * n + i)};
      for (int64_t k = 0; k < 32; ++k) r.prompt.push_back(static_cast<int32_t>(rng() % 150000));
      r.params.max_tokens = steps;
      r.params.temperature = 1.0f;
      r.params.grammar = grammar;
      r.params.ignore_eos = grammar.empty();  // the same length either way, unless a schema's output ends early
      e.add(r);
    }
    double seconds = 0;
    int64_t tokens = 0;
    const auto start = Clock::now();
    while (e.has_work()) {
      const auto before = e.stats();
      const auto t0 = Clock::now();
      e.step();
      // Steps that decode all n (no prefill, no sequence ended yet): the same work with and without the schema.
      const int64_t decoded = e.stats().decode_tokens - before.decode_tokens;
      if (e.stats().prefill_tokens == before.prefill_tokens && decoded == n) {
        seconds += since(t0);
        tokens += decoded;
      }
    }
    if (round == 0) out.warmup_s = since(start);
    out.tokens_per_s = static_cast<double>(tokens) / seconds;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir;
  int threads_n = 0;
  int64_t steps = 48;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc) model_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads_n = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atol(argv[++i]);
    else {
      std::fprintf(stderr, "usage: grammar_bench [--model DIR] [--threads N] [--steps N]\n");
      return 2;
    }
  }
  try {
    if (model_dir.empty()) model_dir = perf::bench_model();
    const auto c = runtime::ModelConfig::load(model_dir);
    const auto w = runtime::ModelWeights::load(c, model_dir);
    const auto tok = runtime::Tokenizer::load(model_dir);
    runtime::cpu::ThreadPool threads(threads_n);

    auto t0 = Clock::now();
    std::vector<std::string> bytes(static_cast<std::size_t>(c.vocab));
    for (int32_t id = 0; id < c.vocab && id < tok->vocab_size(); ++id) bytes[static_cast<std::size_t>(id)] = tok->token_bytes(id);
    auto vocab = std::make_shared<grammar::Vocabulary>(std::move(bytes), c.eos_token_ids);
    std::printf("vocabulary: %d tokens as bytes, sorted: %.1f ms (once per worker)\n", vocab->size(), 1e3 * since(t0));

    grammar::GrammarCache cache(vocab);
    t0 = Clock::now();
    const std::string ebnf = grammar::json_schema_to_ebnf(nlohmann::ordered_json::parse(kSchema));
    const double convert = since(t0);
    t0 = Clock::now();
    auto g = cache.get(ebnf);
    const double compile = since(t0);
    t0 = Clock::now();
    constexpr int kLookups = 1000;
    for (int k = 0; k < kLookups; ++k) g = cache.get(ebnf);
    const double cached = since(t0) / kLookups;
    std::printf("schema (7 properties, nested object, enum, format, pattern, bounded array): %zu automaton nodes\n",
                g->grammar().nodes().size());
    std::printf("  convert to EBNF %.2f ms, compile %.2f ms (first); from the cache %.2f us\n", 1e3 * convert,
                1e3 * compile, 1e6 * cached);

    // Masks on random walks: the first walks compute the token sets of each node they reach.
    std::mt19937 rng(3);
    std::vector<uint64_t> mask(vocab->mask_words());
    const auto walk = [&](double& seconds, int64_t& n) {
      grammar::TokenMatcher m(g);
      for (int s = 0; s < 200 && !m.ended(); ++s) {
        const auto t = Clock::now();
        m.fill_mask(mask);
        seconds += since(t);
        ++n;
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < vocab->size(); ++id) {
          if ((mask[static_cast<std::size_t>(id) / 64] >> (id % 64)) & 1) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        m.accept_token(allowed[rng() % allowed.size()]);
      }
    };
    double cold_s = 0, warm_s = 0;
    int64_t cold_n = 0, warm_n = 0;
    for (int k = 0; k < 8; ++k) walk(cold_s, cold_n);
    const std::size_t nodes = g->nodes_cached();
    for (int k = 0; k < 8; ++k) walk(warm_s, warm_n);
    std::printf("token mask per step (%d-token vocabulary): cold %.0f us (8 walks, %lld steps, %zu nodes' token sets "
                "computed), warm %.1f us (8 more walks, %lld steps, %zu nodes)\n",
                vocab->size(), 1e6 * cold_s / static_cast<double>(cold_n), static_cast<long long>(cold_n), nodes,
                1e6 * warm_s / static_cast<double>(warm_n), static_cast<long long>(warm_n), g->nodes_cached());

    // Alternated and the best of each kept: on a shared machine the slower runs measure the neighbours.
    constexpr int64_t kSeqs = 32;
    Decode plain, constrained;
    std::vector<double> plain_runs, constrained_runs;
    for (int k = 0; k < 2; ++k) {
      const Decode p = decode(c, *w, *tok, threads, kSeqs, steps, "");
      const Decode q = decode(c, *w, *tok, threads, kSeqs, steps, ebnf);
      plain_runs.push_back(p.tokens_per_s);
      constrained_runs.push_back(q.tokens_per_s);
      if (p.tokens_per_s > plain.tokens_per_s) plain = p;
      if (q.tokens_per_s > constrained.tokens_per_s) constrained = q;
    }
    std::printf("decode at %lld sequences, temperature 1, %lld tokens each (steps decoding all %lld): %.1f tokens/s "
                "without a schema (runs %.1f, %.1f), %.1f with it (runs %.1f, %.1f): %.3fx (%.1f%% slower), once the "
                "schema's token sets are warm; warming them (the first %lld sequences of each run) took %.2f s against "
                "%.2f s without\n",
                static_cast<long long>(kSeqs), static_cast<long long>(steps), static_cast<long long>(kSeqs),
                plain.tokens_per_s, plain_runs[0], plain_runs[1], constrained.tokens_per_s, constrained_runs[0],
                constrained_runs[1], constrained.tokens_per_s / plain.tokens_per_s,
                100.0 * (1.0 - constrained.tokens_per_s / plain.tokens_per_s), static_cast<long long>(kSeqs),
                constrained.warmup_s, plain.warmup_s);
  } catch (const Error& e) {
    std::fprintf(stderr, "grammar_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
