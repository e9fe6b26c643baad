#include "runtime/engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace tandem::runtime {

double counter_uniform(uint64_t key, uint64_t step) {
  uint64_t z = key ^ (step * 0xD1B54A32D192ED03ull) ^ 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

namespace {

int32_t argmax(std::span<const float> v) {
  int32_t best = 0;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[static_cast<std::size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

void apply_penalties(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> prompt,
                     std::span<const int32_t> output) {
  if (p.repetition_penalty != 1.0f) {
    std::vector<bool> seen(logits.size(), false);
    for (int32_t t : prompt) seen[static_cast<std::size_t>(t)] = true;
    for (int32_t t : output) seen[static_cast<std::size_t>(t)] = true;
    for (std::size_t i = 0; i < logits.size(); ++i)
      if (seen[i]) logits[i] = logits[i] > 0 ? logits[i] / p.repetition_penalty : logits[i] * p.repetition_penalty;
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int64_t> counts;
    for (int32_t t : output) ++counts[t];
    for (const auto& [t, n] : counts)
      logits[static_cast<std::size_t>(t)] -= p.frequency_penalty * static_cast<float>(n) + p.presence_penalty;
  }
}

}  // namespace

int32_t sample_token(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> prompt,
                     std::span<const int32_t> output, uint64_t key, uint64_t step) {
  apply_penalties(logits, p, prompt, output);
  if (p.temperature <= 1e-5f) return argmax(logits);

  const float inv_t = 1.0f / p.temperature;
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::size_t keep = ids.size();
  // Candidates best first (ties by id) when top-k or top-p need an order;
  // otherwise in id order, which is as reproducible and needs no sort.
  if (p.top_k > 0 || p.top_p < 1.0f) {
    auto better = [&](int32_t a, int32_t b) {
      const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
      return la != lb ? la > lb : a < b;
    };
    if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < keep) {
      keep = static_cast<std::size_t>(p.top_k);
      std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end(), better);
    } else {
      std::sort(ids.begin(), ids.end(), better);
    }
  }
  float max_logit = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < keep; ++i) max_logit = std::max(max_logit, logits[static_cast<std::size_t>(ids[i])]);
  std::vector<double> prob(keep);
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    prob[i] = std::exp(static_cast<double>((logits[static_cast<std::size_t>(ids[i])] - max_logit) * inv_t));
    total += prob[i];
  }
  // top-p: the smallest best-first prefix whose mass reaches top_p.
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (std::size_t i = 0; i < keep; ++i) {
      cum += prob[i] / total;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  // min-p: drop tokens below min_p times the best one's probability (which is 1 here).
  if (p.min_p > 0.0f)
    for (std::size_t i = 0; i < keep; ++i)
      if (prob[i] < static_cast<double>(p.min_p)) prob[i] = 0;
  double mass = 0;
  for (std::size_t i = 0; i < keep; ++i) mass += prob[i];
  const double u = counter_uniform(key, step) * mass;
  double cum = 0;
  int32_t last = ids[0];
  for (std::size_t i = 0; i < keep; ++i) {
    if (prob[i] == 0) continue;
    cum += prob[i];
    last = ids[i];
    if (u < cum) return ids[i];
  }
  return last;
}

PositionLogprobs logprobs_of(std::span<const float> logits, int32_t chosen, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v - max));
  const float log_z = max + static_cast<float>(std::log(sum));
  PositionLogprobs out;
  out.chosen = {chosen, logits[static_cast<std::size_t>(chosen)] - log_z};
  if (n > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    const auto k = static_cast<std::size_t>(std::min<int64_t>(n, static_cast<int64_t>(ids.size())));
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](int32_t a, int32_t b) {
      const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
      return la != lb ? la > lb : a < b;
    });
    for (std::size_t i = 0; i < k; ++i) out.top.push_back({ids[i], logits[static_cast<std::size_t>(ids[i])] - log_z});
  }
  return out;
}

}  // namespace tandem::runtime
