// A worker's engine as the run loops see it: requests in, finished results
// out, counters for the job summary. Used in-process (-np 1) and by the MPI
// worker loop alike.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "launcher/run/wire.h"
#include "router/job_stats.h"
#include "runtime/engine/engine.h"

namespace tandem::launcher {

class WorkerCore {
 public:
  WorkerCore(int rank, std::string role, const runtime::ModelConfig& config, const runtime::ModelWeights& weights,
             kv::BlockPool& pool, runtime::cpu::ThreadPool& threads, const runtime::Tokenizer* tokenizer,
             runtime::EngineOptions options);

  // A request the engine refuses comes back at once as a failed result.
  void submit(const WireRequest& request);
  bool has_work() const { return engine_.has_work() || !refused_.empty(); }
  int64_t load() const { return engine_.num_running() + engine_.num_waiting(); }
  // One engine step; the results of the requests that finished in it.
  std::vector<WireResult> step();
  router::RankReport report() const;

 private:
  int rank_;
  std::string role_;
  runtime::Engine engine_;
  std::vector<WireResult> refused_;
  double busy_s_ = 0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

// The sampling key of a request: its own seed when it gave one (OpenAI's
// meaning: same seed, same output), else the job's seed with its custom_id.
uint64_t sampling_key(bool seed_given, uint64_t seed, uint64_t job_seed, const std::string& custom_id);

}  // namespace tandem::launcher
