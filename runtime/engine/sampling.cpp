#include "runtime/engine/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <iterator>
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

// The largest value, NaNs ignored (-inf when there is none): eight
// independent maxima, so the loop is not one long chain of compares.
float max_value(std::span<const float> v) {
  float m[8];
  std::fill(std::begin(m), std::end(m), -std::numeric_limits<float>::infinity());
  std::size_t i = 0;
  for (; i + 8 <= v.size(); i += 8)
    for (int k = 0; k < 8; ++k) m[k] = v[i + static_cast<std::size_t>(k)] > m[k] ? v[i + static_cast<std::size_t>(k)] : m[k];
  for (; i < v.size(); ++i) m[0] = v[i] > m[0] ? v[i] : m[0];
  return *std::max_element(std::begin(m), std::end(m));
}

// The first index of the largest value (ties to the lowest id; 0 when v[0] is NaN or nothing compares).
int32_t argmax(std::span<const float> v) {
  if (v.empty() || std::isnan(v[0])) return 0;
  const float m = max_value(v);
  const auto it = std::find(v.begin(), v.end(), m);
  return it == v.end() ? 0 : static_cast<int32_t>(it - v.begin());
}

// Best first: higher logit, ties by lower id (a total order, so every sort agrees).
void sort_best_first(std::vector<int32_t>::iterator first, std::vector<int32_t>::iterator last,
                     std::span<const float> logits) {
  std::sort(first, last, [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la != lb ? la > lb : a < b;
  });
}

// ids = the k best tokens (unordered; ties at the k-th value by lower id), for k < v.size():
// the k-th best value from a small heap, then one pass to collect.
void top_k_ids(std::span<const float> v, std::size_t k, std::vector<int32_t>& ids, std::vector<float>& heap) {
  heap.assign(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k));  // NaNs never enter past this point
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  for (std::size_t i = k; i < v.size(); ++i)
    if (v[i] > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      heap.back() = v[i];
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  const float kth = heap.front();
  ids.clear();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] > kth) ids.push_back(static_cast<int32_t>(i));
  for (std::size_t i = 0; i < v.size() && ids.size() < k; ++i)  // ties at the k-th value: lowest ids
    if (v[i] == kth) ids.push_back(static_cast<int32_t>(i));
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

namespace {

// A token's weight relative to the best one: exp((logit - max) / T). Weights
// below e^-kNegligible (under 1e-21 of the best token's) count as zero: they
// could never be drawn, and computing them is most of the work on a wide
// vocabulary.
constexpr float kNegligible = 48.0f;
// top-p orders tokens coarsely first, by bin = floor(-(logit - max) / T * kPerUnit):
// a lower bin holds only better tokens, and only the bins where the prefix
// ends and the draw lands are sorted.
constexpr int kPerUnit = 64;
constexpr int kBins = static_cast<int>(kNegligible) * kPerUnit + 1;  // the last: negligible weights

struct Scratch {
  std::vector<int32_t> ids;
  std::vector<double> prob;
  std::vector<float> heap;
  std::vector<double> mass, kept;  // per bin: all weights; those min-p keeps
  std::vector<uint16_t> bin;       // per token
};

int bin_of(float x) { return x > -kNegligible ? static_cast<int>(-x * static_cast<float>(kPerUnit)) : kBins - 1; }

// top-p (without top-k): the smallest best-first prefix whose mass reaches
// top_p of the total, min-p inside it, then a draw in best-first order, as
// the plain sort-everything sampler does, sorting only one or two bins.
template <class Scaled, class Weight>
int32_t sample_top_p(std::span<const float> logits, Scaled scaled, Weight weight, const SamplingParams& p, double u01,
                     Scratch& sc) {
  const std::size_t n = logits.size();
  const double min_p = p.min_p > 0.0f ? static_cast<double>(p.min_p) : 0.0;
  sc.mass.assign(kBins, 0.0);
  sc.kept.assign(kBins, 0.0);
  sc.bin.resize(n);
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float x = scaled(static_cast<int32_t>(i));
    const double w = weight(x);
    const int b = bin_of(x);
    sc.bin[i] = static_cast<uint16_t>(b);
    total += w;
    sc.mass[static_cast<std::size_t>(b)] += w;
    if (w >= min_p) sc.kept[static_cast<std::size_t>(b)] += w;
  }
  if (!(total > 0)) return argmax(logits);
  // One bin's tokens, best first.
  auto sorted_bin = [&](int b) {
    sc.ids.clear();
    for (std::size_t i = 0; i < n; ++i)
      if (sc.bin[i] == b) sc.ids.push_back(static_cast<int32_t>(i));
    sort_best_first(sc.ids.begin(), sc.ids.end(), logits);
  };
  // Where the prefix ends: bin `last`, its first `in_last` tokens (all bins: n / every token).
  int last = kBins - 1;
  std::size_t in_last = 0;
  double cum = 0;
  for (int b = 0; b < kBins && in_last == 0; ++b) {
    const double m = sc.mass[static_cast<std::size_t>(b)];
    if (m == 0 || cum + m / total < p.top_p) {
      cum += m / total;
      continue;
    }
    sorted_bin(b);  // the crossing bin, token by token
    for (std::size_t k = 0; k < sc.ids.size(); ++k)
      if ((cum += weight(scaled(sc.ids[k])) / total) >= p.top_p) {
        last = b, in_last = k + 1;
        break;
      }
  }
  std::vector<int32_t> last_ids;  // the crossing bin's kept tokens, best first
  double last_kept = 0;
  if (in_last > 0) {
    last_ids.assign(sc.ids.begin(), sc.ids.begin() + static_cast<std::ptrdiff_t>(in_last));
    for (int32_t id : last_ids)
      if (const double w = weight(scaled(id)); w >= min_p) last_kept += w;
  } else {
    last = kBins;  // rounding never reached top_p: every token is kept
  }
  double mass = last_kept;
  for (int b = 0; b < std::min(last, kBins); ++b) mass += sc.kept[static_cast<std::size_t>(b)];
  const double target = u01 * mass;
  // The draw: whole bins while the target lies past them, then token by token.
  double c = 0;
  int32_t picked = -1;
  auto scan = [&](const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      const double w = weight(scaled(id));
      if (w == 0 || w < min_p) continue;
      c += w;
      picked = id;
      if (target < c) return true;
    }
    return false;
  };
  for (int b = 0; b < std::min(last, kBins); ++b) {
    const double k = sc.kept[static_cast<std::size_t>(b)];
    if (k == 0) continue;
    if (c + k <= target) {
      c += k;
      continue;
    }
    sorted_bin(b);
    if (scan(sc.ids)) return picked;
  }
  if (scan(last_ids)) return picked;
  return picked >= 0 ? picked : argmax(logits);
}

// The smallest prefix of ids[0..n) (sorted best first) whose
// share of `total` reaches top_p; n when none does.
std::size_t top_p_prefix(const std::vector<double>& prob, std::size_t n, double total, float top_p) {
  double cum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    cum += prob[i] / total;
    if (cum >= top_p) return i + 1;
  }
  return n;
}

}  // namespace

void apply_logit_rules(std::span<float> logits, const SamplingParams& p, int64_t generated,
                       std::span<const int32_t> eos) {
  for (const auto& [id, bias] : p.logit_bias) logits[static_cast<std::size_t>(id)] += bias;
  if (generated >= p.min_tokens) return;
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  for (int32_t t : p.stop_token_ids) logits[static_cast<std::size_t>(t)] = kBanned;
  if (!p.ignore_eos)
    for (int32_t t : eos)
      if (t >= 0 && static_cast<std::size_t>(t) < logits.size()) logits[static_cast<std::size_t>(t)] = kBanned;
}

int32_t sample_token(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> prompt,
                     std::span<const int32_t> output, uint64_t key, uint64_t step) {
  apply_penalties(logits, p, prompt, output);
  if (p.temperature <= 1e-5f) return argmax(logits);

  const float inv_t = 1.0f / p.temperature;
  const std::size_t n = logits.size();
  thread_local Scratch scratch;  // a 150k-token row would otherwise allocate twice per draw
  std::vector<int32_t>& ids = scratch.ids;
  std::vector<double>& prob = scratch.prob;
  const float max_logit = max_value(logits);
  auto scaled = [&](int32_t id) { return (logits[static_cast<std::size_t>(id)] - max_logit) * inv_t; };
  auto weight = [&](float x) { return x > -kNegligible ? std::exp(static_cast<double>(x)) : 0.0; };

  // Candidates: the top k best first (ties by id), then top-p within them;
  // top-p alone walks probability bins (sample_top_p); otherwise every token
  // in id order, which is as reproducible and needs no sort.
  std::size_t keep = n;
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < n) {
    keep = static_cast<std::size_t>(p.top_k);
    top_k_ids(logits, keep, ids, scratch.heap);
    keep = ids.size();  // fewer only when NaNs fill the row
    sort_best_first(ids.begin(), ids.end(), logits);
    prob.resize(keep);
    double total = 0;
    for (std::size_t i = 0; i < keep; ++i) total += (prob[i] = weight(scaled(ids[i])));
    if (p.top_p < 1.0f) keep = top_p_prefix(prob, keep, total, p.top_p);
  } else if (p.top_p < 1.0f) {
    return sample_top_p(logits, scaled, weight, p, counter_uniform(key, step), scratch);
  } else {
    ids.resize(n);
    std::iota(ids.begin(), ids.end(), 0);
    prob.resize(n);
    for (std::size_t i = 0; i < n; ++i) prob[i] = weight(scaled(static_cast<int32_t>(i)));
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
  const float max = max_value(logits);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v - max));
  const float log_z = max + static_cast<float>(std::log(sum));
  PositionLogprobs out;
  out.chosen = {chosen, logits[static_cast<std::size_t>(chosen)] - log_z};
  if (n > 0) {
    std::vector<int32_t> ids;
    std::vector<float> heap;
    const auto k = static_cast<std::size_t>(std::min<int64_t>(n, static_cast<int64_t>(logits.size())));
    if (k < logits.size()) {
      top_k_ids(logits, k, ids, heap);
    } else {
      ids.resize(k);
      std::iota(ids.begin(), ids.end(), 0);
    }
    sort_best_first(ids.begin(), ids.end(), logits);
    ids.resize(std::min(ids.size(), k));
    for (int32_t id : ids) out.top.push_back({id, logits[static_cast<std::size_t>(id)] - log_z});
  }
  return out;
}

}  // namespace tandem::runtime
