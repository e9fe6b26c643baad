// `tandem run` and `tandem serve`: their command lines. The job itself is
// launcher/run/job.h.
#include <memory>

#include "launcher/commands.h"
#include "launcher/run/job.h"

namespace tandem::launcher {

Action add_run_command(CLI::App& root, int argc, char** argv) {
  auto* cmd = root.add_subcommand("run", "Run a batch job: OpenAI-Batch JSONL in, one output line per input line");
  auto o = std::make_shared<RunOptions>();
  o->config.add_to(cmd);
  cmd->add_option("--model", o->model, "Model directory (overrides model.path)");
  cmd->add_option("--input", o->input, "Input JSONL (overrides job.input)");
  cmd->add_option("--output", o->output, "Output JSONL, appended to (overrides job.output)");
  cmd->add_option("--defaults", o->defaults,
                  "JSON object of request fields merged under every line's body (instead of [defaults] in the job file)");
  cmd->add_flag("--resume", o->resume,
                "Continue an existing output: skip what its checkpoint says is done (automatic on a Slurm requeue)");
  return [o, argc, argv]() { return run_job(*o, argc, argv); };
}

Action add_serve_command(CLI::App& root, int argc, char** argv) {
  auto* cmd = root.add_subcommand(
      "serve", "Serve the model over an OpenAI-compatible HTTP API on rank 0 (same job file and ranks as run)");
  auto o = std::make_shared<RunOptions>();
  o->serve = true;
  o->config.add_to(cmd);
  cmd->add_option("--model", o->model, "Model directory (overrides model.path)");
  cmd->add_option("--host", o->host, "Address to listen on (overrides http.host; default 127.0.0.1)");
  cmd->add_option("--port", o->port, "Port to listen on (overrides http.port; default 8000)")->check(CLI::Range(0, 65535));
  return [o, argc, argv]() { return run_job(*o, argc, argv); };
}

}  // namespace tandem::launcher
