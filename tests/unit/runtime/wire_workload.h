// Requests as rank 0 sends them, for the worker service's tests: random
// prompts of mixed lengths, greedy and sampled, each with its own RNG key.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "engine_helpers.h"  // random_prompt
#include "runtime/service/protocol.h"

namespace tandem::testing {

// n requests (ids 0..n-1): prompts of 10 to 79 tokens, 4 to 12 tokens out
// (ignore_eos), every other one greedy.
inline std::vector<service::WireRequest> wire_workload(int n) {
  std::mt19937 rng(17);
  std::vector<service::WireRequest> reqs;
  for (int i = 0; i < n; ++i) {
    service::WireRequest r;
    r.id = static_cast<uint64_t>(i);
    r.prompt = random_prompt(rng, 10 + (i * 13) % 70);
    r.params.max_tokens = 4 + i % 9;
    r.params.ignore_eos = true;
    r.params.temperature = i % 2 ? 0.0f : 0.8f;
    r.rng_key = 1000 + static_cast<uint64_t>(i);
    reqs.push_back(r);
  }
  return reqs;
}

}  // namespace tandem::testing
