// Encoding throughput of Tandem's tokenizer on one core: encodes every line of
// a JSONL file of strings (one prompt per call, as rank 0 does), `repeat`
// times, and prints one JSON object with the same fields as
// tests/reference/hf_tokenize.js bench, so perf/tokenizer_bench.sh can set the
// two side by side. Prints figures; never fails on time.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_bench MODEL_DIR LINES.jsonl [REPEAT] [MIN_BYTES]\n");
    return 2;
  }
  try {
    auto tok = tandem::runtime::Tokenizer::load(argv[1]);
    const int repeat = argc > 3 ? std::atoi(argv[3]) : 5;
    const std::size_t min_bytes = argc > 4 ? std::strtoul(argv[4], nullptr, 10) : 0;
    std::ifstream in(argv[2]);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) {
      if (l.empty()) continue;
      auto s = nlohmann::json::parse(l).get<std::string>();
      if (s.size() >= min_bytes) lines.push_back(std::move(s));
    }
    std::size_t bytes = 0, tokens = 0;
    double seconds = 0;
    for (int r = 0; r < repeat; ++r) {
      for (const auto& s : lines) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto ids = tok->encode(s, false);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        bytes += s.size();
        tokens += ids.size();
      }
    }
    nlohmann::json out = {{"bytes", bytes},
                          {"tokens", tokens},
                          {"seconds", seconds},
                          {"mb_per_s", bytes / 1e6 / seconds},
                          {"tokens_per_s", tokens / seconds},
                          {"lines", lines.size()},
                          {"repeat", repeat}};
    std::cout << out.dump() << "\n";
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
