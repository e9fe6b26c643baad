// `tandem run`'s front end for rank 0's loop: the batch file streamed in,
// every line turned into a request or an error record, one output line per
// input line in the resumable output, progress lines, the planner's epochs
// (each read ahead and planned before any of it is placed), the reorder
// window, and the summary at the end.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/epoch_planner.h"
#include "router/batch_output.h"
#include "router/body_defaults.h"
#include "router/embeddings.h"
#include "router/dispatcher.h"
#include "router/input_scan.h"
#include "router/prompt_builder.h"

namespace tandem::router {

struct BatchSetup {
  std::string input, output, summary;
  // A small JSON file of the figures in the progress lines (state, done, failed, to_do, rates, ETA),
  // replaced whole at every line and at the end: docs/run.md. Empty: none.
  std::string progress_file;
  std::shared_ptr<const BodyDefaults> defaults;  // merged under every line's body; null: none
  EmbeddingPooling pooling;  // how /v1/embeddings lines pool (router/embeddings.h)
  int64_t hidden = 0;        // the model's hidden size: the pooled vectors' width
  int64_t max_line_bytes = 1 << 20;  // a longer input line becomes an error record, never held whole
  PromptContext prompts;
  OutputContext outputs;
  DispatchOptions dispatch;
  int64_t window_per_worker = 128;   // requests in flight per decode worker
  bool input_order = false;          // job.output_order = "input": output lines in the input's order
  double flush_seconds = 10;         // fsync output + checkpoint at least this often
  double progress_seconds = 30;      // a progress line this often when stderr is not a terminal
  double drain_seconds = 60;         // after a stop signal: time for the requests in flight
  int64_t reorder_window = 0;        // requests looked ahead to group shared prefixes (0, 1: off)
  // Helper threads that parse input lines and build their prompts (tokenize)
  // ahead of the main thread, which keeps the file, the output and MPI; 0:
  // the main thread does it all.
  int tokenize_threads = 0;
  uint64_t job_seed = 0;             // sampling seed for requests without one
  bool resume = false;               // continue an existing output (skip what its checkpoint says is done)
  // What InputScan::run found before any work (scanned: it ran; its result
  // may be null); when it did not run, the front end runs it first.
  std::shared_ptr<const InputScan> scan;
  bool scanned = false;
  int64_t shard_index = 0, shard_count = 1;  // a job array task takes input lines i with i % count == index
  int64_t array_task = -1;                   // SLURM_ARRAY_TASK_ID; -1 outside an array
  // job.mode = "auto": before each epoch of epoch_requests input lines, the
  // planner reads the epoch's requests ahead and chooses the split; the
  // first P of worker_ranks then prefill. Null: the split never changes.
  planner::EpochPlanner* planner = nullptr;
  int64_t epoch_requests = 1024;
  std::vector<int> worker_ranks;
  std::vector<std::string> hosts;  // every rank's host, by rank (empty: one process): the summary's nodes
  std::string kernels;             // the workers' arithmetic, for the summary: their CPU kernel table, or the backend
  double worker_timeout_seconds = 0;  // a worker silent this long ends the job (0: never; router_loop.h)
};

// Runs the job through rank 0's loop; returns the summary (also written to
// setup.summary). stop_signal: set by the USR1/TERM handler. Throws
// tandem::Error on an output that cannot be written.
nlohmann::json run_batch(const BatchSetup& setup, WorkerLink& link, const std::atomic<int>* stop_signal);

}  // namespace tandem::router
