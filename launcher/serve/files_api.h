// The OpenAI Files API on `tandem serve` (purpose "batch"): POST /v1/files
// (multipart, streamed to disk, at most http.max_file_bytes), GET /v1/files,
// GET /v1/files/{id}, GET /v1/files/{id}/content, DELETE /v1/files/{id}.
// The files live in http.batch_dir/files (file_store.h) and outlast the job.
#pragma once

#include <httplib.h>

#include "launcher/config/config.h"
#include "launcher/serve/file_store.h"
#include "router/metrics.h"

namespace tandem::launcher {

void add_file_routes(httplib::Server& server, FileStore& store, const HttpConfig& http, router::Metrics& metrics);

}  // namespace tandem::launcher
