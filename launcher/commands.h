// Subcommands of the `tandem` CLI. Each add_*_command() registers its
// options on the root app and returns the action to run when it is chosen;
// the action returns the process exit code and may throw tandem::Error.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "launcher/config/config.h"

namespace tandem::launcher {

using Action = std::function<int()>;

// `-c/--config FILE` and repeated `--set section.key=value`, shared by every
// command that reads a job configuration.
struct ConfigOptions {
  std::string path;
  std::vector<std::string> overrides;

  void add_to(CLI::App* cmd);
  Config load() const;
};

// Logs the effective configuration once, at info level, one line per key.
void log_effective_config(const Config& config);

Action add_config_command(CLI::App& root);
Action add_tokenize_command(CLI::App& root);
Action add_make_model_command(CLI::App& root);
Action add_quantize_command(CLI::App& root);
Action add_generate_command(CLI::App& root);
// argc/argv go to MPI_Init_thread.
Action add_run_command(CLI::App& root, int argc, char** argv);
Action add_serve_command(CLI::App& root, int argc, char** argv);
Action add_simulate_command(CLI::App& root);
Action add_plan_command(CLI::App& root);

}  // namespace tandem::launcher
