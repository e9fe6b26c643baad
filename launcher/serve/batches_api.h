// The OpenAI Batches API on `tandem serve`: POST /v1/batches (input_file_id,
// endpoint, completion_window, metadata), GET /v1/batches (limit, after),
// GET /v1/batches/{id}, POST /v1/batches/{id}/cancel. The batches run on
// rank 0's BatchRunner (batch_runner.h); their records live in
// http.batch_dir/batches and outlast the job.
#pragma once

#include <httplib.h>

#include <atomic>

#include "launcher/config/config.h"
#include "launcher/serve/batch_runner.h"
#include "launcher/serve/file_store.h"
#include "router/metrics.h"

namespace tandem::launcher {

// draining: true once the server stops (new batches get 503).
void add_batch_routes(httplib::Server& server, BatchRunner& runner, FileStore& files, const std::atomic<bool>& draining,
                      router::Metrics& metrics);

// A completion_window in seconds: "24h" (OpenAI's one value), or, as Tandem's
// extension, a whole number of seconds, minutes or hours ("90s", "30m",
// "48h") from 1 s to 7 days; -1 when it is neither.
int64_t completion_window_seconds(const std::string& window);

}  // namespace tandem::launcher
