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
