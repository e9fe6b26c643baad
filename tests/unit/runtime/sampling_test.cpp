// The sampler against the plain algorithm it must agree with: sort every
// token best first, keep top-k, keep the top-p prefix, drop below min-p,
// draw by the cumulative weights. sample_token avoids the full sort and the
// negligible weights; it must still pick the same token.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "runtime/engine/sampling.h"

using tandem::runtime::SamplingParams;

namespace {

int32_t reference_sample(std::vector<float> logits, const SamplingParams& p, uint64_t key, uint64_t step) {
  const float inv_t = 1.0f / p.temperature;
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::size_t keep = ids.size();
  if (p.top_k > 0 || p.top_p < 1.0f) {
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<std::size_t>(a)] != logits[static_cast<std::size_t>(b)]
                 ? logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)]
                 : a < b;
    });
    if (p.top_k > 0) keep = std::min(keep, static_cast<std::size_t>(p.top_k));
  }
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> prob(keep);
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i)
    total += (prob[i] = std::exp(static_cast<double>((logits[static_cast<std::size_t>(ids[i])] - max_logit) * inv_t)));
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (std::size_t i = 0; i < keep; ++i)
      if ((cum += prob[i] / total) >= p.top_p) {
        keep = i + 1;
        break;
      }
  }
  for (std::size_t i = 0; i < keep; ++i)
    if (prob[i] < static_cast<double>(p.min_p)) prob[i] = 0;
  double mass = 0;
  for (std::size_t i = 0; i < keep; ++i) mass += prob[i];
  const double u = tandem::runtime::counter_uniform(key, step) * mass;
  double cum = 0;
  for (std::size_t i = 0; i < keep; ++i)
    if (prob[i] > 0 && u < (cum += prob[i])) return ids[i];
  return -1;
}

}  // namespace

TEST_CASE("sample_token picks what the plain sort-everything sampler picks", "[sampling]") {
  std::mt19937 rng(7);
  int cases = 0, distinct_from_argmax = 0;
  for (const std::size_t vocab : {std::size_t{1000}, std::size_t{151936}}) {
    for (int shape = 0; shape < 4; ++shape) {  // spread; one dominant token; coarse values with many ties; flat
      std::vector<float> logits(vocab);
      std::normal_distribution<float> d(0.0f, shape == 1 ? 2.0f : shape == 3 ? 0.3f : 3.0f);
      for (auto& x : logits) x = d(rng);
      if (shape == 1) logits[vocab / 3] = 25.0f;
      if (shape == 2)
        for (auto& x : logits) x = std::round(x);
      const auto greedy = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      for (const float t : {0.3f, 0.7f, 1.0f, 1.5f})
        for (const int64_t k : {int64_t{0}, int64_t{1}, int64_t{20}, int64_t{500}})
          for (const float top_p : {1.0f, 0.5f, 0.9f, 0.99f})
            for (const float min_p : {0.0f, 0.05f}) {
              SamplingParams p;
              p.temperature = t, p.top_k = k, p.top_p = top_p, p.min_p = min_p;
              for (uint64_t step = 0; step < (vocab > 1000 ? 1u : 4u); ++step) {
                std::vector<float> row = logits;
                const int32_t got = tandem::runtime::sample_token(row, p, {}, {}, 1234 + step, step);
                const int32_t want = reference_sample(logits, p, 1234 + step, step);
                INFO("vocab " << vocab << " shape " << shape << " T " << t << " top_k " << k << " top_p " << top_p
                              << " min_p " << min_p << " step " << step);
                REQUIRE(got == want);
                ++cases;
                distinct_from_argmax += got != greedy;
              }
            }
    }
  }
  // Not a degenerate comparison: most draws are not simply the best token.
  CHECK(cases == 4 * 4 * 4 * 4 * 2 * (1 + 4));
  CHECK(distinct_from_argmax > cases / 4);
}

// logit_bias and min_tokens against the plain definition: bias added to the
// named logits, stop tokens (and EOS unless ignore_eos) removed while fewer
// than min_tokens are out, then the plain sampler.
TEST_CASE("logit_bias and min_tokens draw what the plain sampler draws on the edited logits", "[sampling]") {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const std::vector<int32_t> eos = {3, 9};
  int changed = 0;
  for (int c = 0; c < 300; ++c) {
    std::vector<float> logits(64);
    for (auto& x : logits) x = normal(rng);
    SamplingParams p;
    p.temperature = c % 3 == 0 ? 0.0f : 0.7f + 0.01f * static_cast<float>(c % 50);
    p.top_k = c % 4 == 1 ? 10 : 0;
    p.top_p = c % 5 == 2 ? 0.8f : 1.0f;
    p.logit_bias = {{static_cast<int32_t>(c % 64), 5.0f}, {static_cast<int32_t>((c * 7) % 64), -100.0f}};
    std::sort(p.logit_bias.begin(), p.logit_bias.end());
    if (p.logit_bias[0].first == p.logit_bias[1].first) p.logit_bias.pop_back();
    p.stop_token_ids = {static_cast<int32_t>((c * 11) % 64)};
    p.min_tokens = 4;
    p.ignore_eos = c % 2 == 0;
    const int64_t generated = c % 8;  // half the cases before min_tokens, half after
    std::vector<float> edited = logits;
    for (const auto& [id, b] : p.logit_bias) edited[static_cast<std::size_t>(id)] += b;
    if (generated < p.min_tokens) {
      std::vector<int32_t> banned = p.stop_token_ids;
      if (!p.ignore_eos) banned.insert(banned.end(), eos.begin(), eos.end());
      for (int32_t t : banned) edited[static_cast<std::size_t>(t)] = -std::numeric_limits<float>::infinity();
    }
    std::vector<float> row = logits;
    tandem::runtime::apply_logit_rules(row, p, generated, eos);
    CHECK(row == edited);
    const int32_t want = p.temperature == 0.0f ? static_cast<int32_t>(std::max_element(edited.begin(), edited.end()) - edited.begin())
                                               : reference_sample(edited, p, 99 + static_cast<uint64_t>(c), 5);
    const int32_t got = tandem::runtime::sample_token(row, p, {}, {}, 99 + static_cast<uint64_t>(c), 5);
    CHECK(got == want);
    if (generated < p.min_tokens) {
      CHECK(got != p.stop_token_ids[0]);
      if (!p.ignore_eos) CHECK((got != 3 && got != 9));
    }
    std::vector<float> untouched = logits;
    changed += tandem::runtime::sample_token(untouched, p, {}, {}, 99 + static_cast<uint64_t>(c), 5) != got;
  }
  CHECK(changed > 30);  // the rules do change draws
}
