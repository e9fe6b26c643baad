// Rank 0's job: stream the input file, turn each line into a request (or an
// error line), hand requests to workers through a router::WorkerLink, write one output
// line per input line, show progress, and write the summary. It is the same
// loop for -np 1 (the link steps an engine in this process) and for MPI (the
// link sends messages).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/config/config.h"
#include "router/dispatcher.h"
#include "runtime/service/protocol.h"
#include "router/batch_output.h"
#include "router/job_stats.h"
#include "planner/epoch_planner.h"
#include "router/prompt_builder.h"
#include "launcher/stop_signals.h"

namespace tandem::launcher {

struct RouterSetup {
  const Config* config = nullptr;
  std::string input, output, summary;
  int64_t max_line_bytes = 1 << 20;  // a longer input line becomes an error record, never held whole
  router::PromptContext prompts;
  router::OutputContext outputs;
  int64_t window_per_worker = 128;  // requests in flight per worker
  int64_t local_prefill_tokens = 0;  // disaggregated: shorter prompts prefill on their decode rank
  int64_t block_size = 16;
  std::string route_policy = "kv_aware";
  double overlap_weight = 1.0, overlap_weight_host = 0.75, overlap_weight_disk = 0.25;
  int64_t prefill_saturation_tokens = 1 << 30;  // queued prompt tokens per prefill rank that count as saturated
  bool resume = false;  // continue an existing output (skip what its checkpoint says is done)
  int64_t shard_index = 0, shard_count = 1;  // a job array task takes input lines i with i % count == index
  int64_t array_task = -1;                    // SLURM_ARRAY_TASK_ID; -1 outside an array
  // job.mode = "auto": before each epoch of epoch_requests input lines, the
  // planner reads the epoch's requests ahead and chooses the split; the
  // first P of worker_ranks then prefill. Null: the split never changes.
  planner::EpochPlanner* planner = nullptr;
  int64_t epoch_requests = 1024;
  std::vector<int> worker_ranks;
};

router::DispatchOptions dispatch_options(const RouterSetup& setup);

// Runs the job; returns the summary. Throws tandem::Error on I/O failure.
nlohmann::json run_router(const RouterSetup& setup, router::WorkerLink& link);

}  // namespace tandem::launcher
