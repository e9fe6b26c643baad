// Rank 0's own throughput: requests per second that it reads, parses,
// tokenizes (Qwen3's tokenizer), places and writes (with its checkpoint),
// through the same loop and batch front end as `tandem run`, with the
// workers out of the way: a link whose one worker answers every request at
// once with one token. Two prompt sizes, ~20 and ~2,000 tokens, each with
// the tokenizing all on the main thread (the baseline, same run) and with
// 1, 2, 4 ... helper threads (router.tokenize_threads). Prints requests/s,
// the ratio to the baseline, core-seconds per million requests (all threads,
// and the main thread alone: its cost sets the ceiling that more helpers
// reach). Never fails on time.
//   router_bench TOKENIZER_DIR [REQUESTS] [MAX_THREADS]
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <ctime>

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

struct Figures {
  double rps = 0, cpu_per_request = 0, main_cpu_per_request = 0, tokens = 0;
};

double main_thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// One pass of `tandem run`'s front end over `input` with `threads` tokenizing helpers.
Figures measure(const runtime::Tokenizer& tok, const std::filesystem::path& input, int count, int threads) {
  router::BatchSetup s;
  s.input = input.string();
  s.output = input.string() + ".out";
  s.summary = s.output + ".summary.json";
  std::filesystem::remove(s.output);
  std::filesystem::remove(s.output + ".ckpt");
  s.prompts.tokenizer = &tok;
  s.prompts.max_model_len = 40960;
  s.prompts.vocab_size = 151936;
  s.outputs.served_name = "bench";
  s.outputs.tokenizer = &tok;
  s.window_per_worker = 1 << 20;  // the loop, not a worker's window, is what is measured
  s.progress_seconds = 1e9;
  s.tokenize_threads = threads;
  InstantLink link;
  const double cpu0 = cpu_seconds(), main0 = main_thread_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  const auto summary = router::run_batch(s, link, nullptr);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Figures f;
  f.rps = count / wall;
  f.cpu_per_request = (cpu_seconds() - cpu0) / count;
  f.main_cpu_per_request = (main_thread_cpu_seconds() - main0) / count;
  f.tokens = static_cast<double>(summary["prompt_tokens"].get<int64_t>()) / count;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: router_bench TOKENIZER_DIR [REQUESTS] [MAX_THREADS]\n");
    return 2;
  }
  const auto tok = runtime::Tokenizer::load(argv[1]);
  const int n = argc > 2 ? std::atoi(argv[2]) : 20000;
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int max_threads = argc > 3 ? std::atoi(argv[3]) : std::max(1, cpus - 1);
  const auto dir = std::filesystem::temp_directory_path() / ("tandem-router-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::printf("%-14s %8s %9s %12s %10s %12s %14s %12s\n", "prompt", "helpers", "requests", "requests/s", "vs inline",
              "core-s/1M", "main core-s/1M", "ceiling/s*");
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
    double inline_rps = 0;
    for (int threads = 0; threads <= max_threads; threads = threads == 0 ? 1 : threads * 2) {
      const Figures f = measure(*tok, input, count, threads);
      if (threads == 0) inline_rps = f.rps;
      char label[32];
      std::snprintf(label, sizeof label, "~%.0f tokens", f.tokens);
      std::printf("%-14s %8d %9d %12.0f %9.2fx %12.0f %14.0f %12.0f\n", label, threads, count, f.rps, f.rps / inline_rps,
                  f.cpu_per_request * 1e6, f.main_cpu_per_request * 1e6, 1.0 / f.main_cpu_per_request);
    }
  }
  std::filesystem::remove_all(dir);
  std::printf("helpers: rank 0's tokenizing threads (router.tokenize_threads); 0: all on the main thread (the baseline).\n"
              "* ceiling: requests/s once the helpers keep up, set by the main thread's own cost (read, place, write).\n"
              "  A 1,000-GPU batch job asks ~5,000 requests/s of rank 0 (a GPU finishes a few requests per second:\n"
              "  ~300/s for 64 H100s in the simulator's shifting workload).\n");
  return 0;
}
