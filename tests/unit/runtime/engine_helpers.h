// Helpers of the engine's unit tests: random prompts, and running an engine until it has no work.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "runtime/engine/engine.h"

namespace tandem::testing {

inline std::vector<int32_t> random_prompt(std::mt19937& rng, int64_t n) {
  std::uniform_int_distribution<int32_t> d(0, 150000);
  std::vector<int32_t> p(static_cast<std::size_t>(n));
  for (auto& t : p) t = d(rng);
  return p;
}

inline std::map<uint64_t, runtime::EngineOutput> run_all(runtime::Engine& e) {
  std::map<uint64_t, runtime::EngineOutput> done;
  int64_t guard = 0;
  while (e.has_work()) {
    REQUIRE(++guard < 100000);
    for (auto& o : e.step())
      if (o.finished) done[o.id] = std::move(o);
  }
  return done;
}

}  // namespace tandem::testing
