// tandem: the command-line entry point. Parses the command line, runs the
// chosen subcommand, and turns a tandem::Error into one line on stderr and a
// non-zero exit. Libraries never exit; this file decides how the process ends.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "common/error.h"
#include "launcher/build_info.h"
#include "launcher/commands.h"
#include "launcher/stop_signals.h"

namespace {

// Runs before any shared library's constructor: the executable's ELF
// preinit array comes first in the dynamic loader's initialisation, once it
// has mapped and relocated every library (25-70 ms after exec on the 2-core
// test machine; nothing in-process can catch a signal before that).
// Libraries start slowly here: libinfinipath (which libfabric's PSM
// providers bring in) calibrates its timebase for ~250 ms in its
// constructor, after installing a SIGTERM handler of its own that ends the
// process. So USR1 and TERM are held (blocked, pending) from here until main
// has caught them, then delivered: none is lost, none kills the process.
extern "C" void tandem_preinit(int, char**, char**) { tandem::launcher::hold_stop_signals(); }

[[gnu::section(".preinit_array"), gnu::used]] void (*const kPreinit)(int, char**, char**) = &tandem_preinit;

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem::launcher;
  catch_stop_signals();  // and the held ones delivered: Slurm's USR1/TERM may come while the ranks start
  CLI::App app{
      "Tandem: batch and offline LLM inference on HPC clusters, as one MPI job.\n"
      "Rank 0 routes; the other ranks prefill or decode; KV moves by MPI one-sided RMA.",
      "tandem"};
  app.set_version_flag("--version", build_info());
  app.require_subcommand(1);
  app.fallthrough();

  std::vector<std::pair<CLI::App*, Action>> commands;
  auto add = [&](Action a) { commands.emplace_back(app.get_subcommands({}).back(), std::move(a)); };
  add(add_config_command(app));
  add(add_tokenize_command(app));
  add(add_make_model_command(app));
  add(add_quantize_command(app));
  add(add_generate_command(app));
  add(add_run_command(app, argc, argv));
  add(add_serve_command(app, argc, argv));
  add(add_simulate_command(app));
  add(add_plan_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Only run and serve drain; every other command ends on USR1/TERM as any program does.
  if (!app.got_subcommand("run") && !app.got_subcommand("serve")) release_stop_signals();
  try {
    for (auto& [cmd, action] : commands)
      if (cmd->parsed()) return action();
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: internal error: %s (please report it)\n", e.what());
    return 3;
  }
  return 0;
}
