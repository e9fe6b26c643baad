// Rank 0's own throughput: requests per second that it reads, parses,
// tokenizes (Qwen3's tokenizer), places and writes (with its checkpoint),
// through the same loop and batch front end as `tandem run`, with the
// workers out of the way: a link whose one worker answers every request at
// once with one token. Two prompt sizes, ~20 and ~2,000 tokens. Prints
// requests/s, core-seconds per million requests, and what a 1,000-GPU job
// would need of rank 0 (the baseline: a worker's request rate, measured by
// the job's own figures elsewhere, is far lower). Never fails on time.
//   router_bench TOKENIZER_DIR [REQUESTS]
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "router/loop/batch_frontend.h"
#include "runtime/tokenizer/tokenizer.h"

using namespace tandem;

namespace {

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// One worker that finishes every request at once with one token.
class InstantLink : public router::WorkerLink {
 public:
  std::vector<int> workers() const override { return {1}; }
  void submit(int, const service::WireRequest& r) override {
    service::WireResult res;
    res.id = r.id;
    res.tokens = {42};
    res.finish_reason = "length";
    res.worker = 1;
    done_.push_back(std::move(res));
  }
  void cancel(int, uint64_t) override {}
  void poll(router::LinkEvents& events) override {
    if (!reported_) {
      service::RankReport loaded;
      loaded.rank = 1;
      events.stats.push_back(loaded);
      reported_ = true;
    }
    events.results.insert(events.results.end(), std::make_move_iterator(done_.begin()), std::make_move_iterator(done_.end()));
    done_.clear();
  }
  std::vector<service::RankReport> shutdown(bool) override { return {}; }

 private:
  std::vector<service::WireResult> done_;
  bool reported_ = false;
};

std::string words(std::mt19937& rng, int n) {
  static const char* kWords[] = {"cluster", "node", "rank", "queue", "token", "model", "prefill", "decode", "block",
                                 "cache", "epoch", "router", "scheduler", "the", "of", "and", "a", "batch", "job"};
  std::string s;
  for (int i = 0; i < n; ++i) s += std::string(i ? " " : "") + kWords[rng() % (sizeof kWords / sizeof *kWords)];
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: router_bench TOKENIZER_DIR [REQUESTS]\n");
    return 2;
  }
  const auto tok = runtime::Tokenizer::load(argv[1]);
  const int n = argc > 2 ? std::atoi(argv[2]) : 20000;
  const auto dir = std::filesystem::temp_directory_path() / ("tandem-router-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::printf("%-16s %10s %14s %18s %22s\n", "prompt", "requests", "requests/s", "core-s per 1M req",
              "rank-0 cores at 1,000 GPUs*");
  for (const int prompt_words : {18, 1800}) {  // about 20 and 2,000 tokens
    std::mt19937 rng(7);
    const auto input = dir / ("in" + std::to_string(prompt_words) + ".jsonl");
    const int count = prompt_words > 100 ? std::max(1, n / 10) : n;
    {
      std::ofstream f(input);
      for (int i = 0; i < count; ++i)
        f << nlohmann::json{{"custom_id", "r" + std::to_string(i)}, {"prompt", words(rng, prompt_words)}, {"max_tokens", 1}}.dump()
          << "\n";
    }
    router::BatchSetup s;
    s.input = input.string();
    s.output = (dir / ("out" + std::to_string(prompt_words) + ".jsonl")).string();
    s.summary = s.output + ".summary.json";
    std::filesystem::remove(s.output);
    std::filesystem::remove(s.output + ".ckpt");
    s.prompts.tokenizer = tok.get();
    s.prompts.max_model_len = 40960;
    s.prompts.vocab_size = 151936;
    s.outputs.served_name = "bench";
    s.outputs.tokenizer = tok.get();
    s.window_per_worker = 1 << 20;  // the loop, not a worker's window, is what is measured
    s.progress_seconds = 1e9;
    InstantLink link;
    const double cpu0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    const auto summary = router::run_batch(s, link, nullptr);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_seconds() - cpu0;
    const double rps = count / wall;
    const double tokens = static_cast<double>(summary["prompt_tokens"].get<int64_t>()) / count;
    // *A worker (one GPU) finishes a few requests per second on a batch job
    // (~300/s for 64 H100s in the simulator's shifting workload: ~5 each);
    // 1,000 GPUs then ask rank 0 for ~5,000 requests/s.
    const double needed = 5000.0 / rps * (cpu / wall);
    char label[32];
    std::snprintf(label, sizeof label, "~%.0f tokens", tokens);
    std::printf("%-16s %10d %14.0f %18.0f %22.2f\n", label, count, rps, cpu / count * 1e6, needed);
  }
  std::filesystem::remove_all(dir);
  std::printf("* cores rank 0 would spend at 5,000 requests/s (1,000 GPUs at ~5 requests/s each); one core "
              "is enough below 1.0\n");
  return 0;
}
