// Sampling one row of Qwen3's vocabulary (151,936 logits) on the host: what a
// non-greedy step costs per sequence after the forward pass. Baseline, in the
// same run: the greedy pick, one pass over the row.
//
//   sampling_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "runtime/engine/sampling.h"

using tandem::runtime::SamplingParams;

namespace {

// Median over `reps` draws of one row, in milliseconds.
double per_row_ms(const std::vector<float>& logits, const SamplingParams& p, int reps) {
  std::vector<double> ms;
  std::vector<float> row;
  for (int i = 0; i < reps; ++i) {
    row = logits;  // sample_token works in place
    const auto t0 = std::chrono::steady_clock::now();
    volatile int32_t tok = tandem::runtime::sample_token(row, p, {}, {}, 99, static_cast<uint64_t>(i));
    (void)tok;
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[static_cast<std::size_t>(reps / 2)];
}

}  // namespace

int main() {
  // Logits shaped like a language model's: a broad body and a few strong candidates.
  std::mt19937 rng(5);
  std::normal_distribution<float> body(-2.0f, 2.5f);
  std::vector<float> logits(151936);
  for (auto& x : logits) x = body(rng);
  for (int i = 0; i < 20; ++i) logits[rng() % logits.size()] = 12.0f + static_cast<float>(i % 5);

  // And a flat row (an untrained model's, or a hot temperature): the nucleus holds most of the vocabulary.
  std::vector<float> flat(logits.size());
  std::normal_distribution<float> wide(0.0f, 0.5f);
  for (auto& x : flat) x = wide(rng);

  SamplingParams greedy;
  greedy.temperature = 0;
  const double base = per_row_ms(logits, greedy, 31);
  std::printf("sampling one row of %zu logits, median of 31 draws\n", logits.size());
  std::printf("  %-38s %7.3f ms  (baseline)\n", "greedy (one pass)", base);
  struct Case {
    const char* name;
    float temperature, top_p, min_p;
    int64_t top_k;
  };
  const Case cases[] = {{"temperature 0.7", 0.7f, 1.0f, 0.0f, 0},
                        {"temperature 0.7, top_p 0.9", 0.7f, 0.9f, 0.0f, 0},
                        {"temperature 1.0, top_p 0.95", 1.0f, 0.95f, 0.0f, 0},
                        {"temperature 0.7, top_k 50", 0.7f, 1.0f, 0.0f, 50},
                        {"temperature 0.7, top_k 50, top_p 0.9", 0.7f, 0.9f, 0.0f, 50},
                        {"temperature 1.0, min_p 0.05", 1.0f, 1.0f, 0.05f, 0}};
  for (const Case& c : cases) {
    SamplingParams p;
    p.temperature = c.temperature, p.top_p = c.top_p, p.min_p = c.min_p, p.top_k = c.top_k;
    const double ms = per_row_ms(logits, p, 31);
    std::printf("  %-38s %7.3f ms  x%.1f greedy; %5.0f ms for a 128-sequence step on one core\n", c.name, ms, ms / base,
                128 * ms);
  }
  SamplingParams flat_p;
  flat_p.temperature = 1.0f, flat_p.top_p = 0.9f;
  const double ms = per_row_ms(flat, flat_p, 31);
  std::printf("  %-38s %7.3f ms  x%.1f greedy; %5.0f ms for a 128-sequence step on one core\n",
              "flat row: temperature 1.0, top_p 0.9", ms, ms / base, 128 * ms);
  return 0;
}
