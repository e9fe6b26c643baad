// `tandem run` and `tandem serve` as one MPI job: the wiring from the
// command line to the role loops. Rank 0 routes (batch file or HTTP); the
// other ranks run worker services; with one rank, router and engine share
// the process.
#pragma once

#include <cstdint>
#include <string>

#include "launcher/commands.h"

namespace tandem::launcher {

struct RunOptions {
  ConfigOptions config;
  std::string model, input, output;
  std::string defaults;  // --defaults FILE.json: [defaults] from a file
  bool resume = false;
  bool serve = false;  // tandem serve: HTTP on rank 0 instead of the input file
  std::string host;
  int64_t port = -1;
};

// Runs the job on this rank; returns the process's exit code. Every rank
// agrees on a start-up error (one line from rank 0, exit 2, before any
// work); a failure after that ends every rank at once (MPI_Abort) with one
// line naming the rank, whatever was thrown.
int run_job(const RunOptions& o, int argc, char** argv);

}  // namespace tandem::launcher
