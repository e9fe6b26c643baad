// `tandem serve`: the job's rank 0 as an OpenAI-compatible HTTP endpoint.
//
// Threads: cpp-httplib's pool answers HTTP (parsing, tokenizing, formatting
// and streaming responses); the calling thread is the router, the only one
// that talks to the workers (MPI). They meet in an Inbox: HTTP threads post
// new requests and cancellations, the router posts tokens and results back to
// each request's Exchange and wakes the thread that waits on it.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "launcher/config/config.h"
#include "router/dispatcher.h"
#include "planner/epoch_planner.h"
#include "router/batch_output.h"
#include "router/embeddings.h"
#include "router/prompt_builder.h"

namespace tandem::launcher {

struct ServeSetup {
  const Config* config = nullptr;
  router::PromptContext prompts;
  router::OutputContext outputs;  // served_name: the one model /v1/models lists
  router::EmbeddingPooling pooling;  // how /v1/embeddings pools (router/embeddings.h)
  int64_t hidden = 0;                // the embeddings' width
  int64_t max_line_bytes = 1 << 20;  // a longer line of a batch's input file becomes an error record
  router::DispatchOptions dispatch;
  int64_t workers = 1;            // worker ranks that must load before /health says 200
  // job.mode = "auto": every epoch_seconds the planner sizes the next epoch
  // from the requests of the last one; the first P of worker_ranks prefill.
  planner::EpochPlanner* planner = nullptr;
  double epoch_seconds = 60;
  std::vector<int> worker_ranks;
  double worker_timeout_seconds = 0;  // workers under MPI: one silent this long ends the server (router_loop.h)
};

class HttpFrontend;
struct FrontendDeleter {
  void operator()(HttpFrontend* f) const;
};
using FrontendPtr = std::unique_ptr<HttpFrontend, FrontendDeleter>;

// Binds host:port now (so a busy port stops the job before workers start);
// throws tandem::Error with one line when it cannot.
FrontendPtr bind_frontend(const ServeSetup& setup);

// Serves until SIGTERM/SIGINT/USR1 (g_stop_signal), then finishes in-flight
// requests for up to http.drain_seconds, stops the workers, and returns 0.
int run_serve(const ServeSetup& setup, HttpFrontend& frontend, router::WorkerLink& link);

}  // namespace tandem::launcher
