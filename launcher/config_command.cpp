// `tandem config`: check a job file and print the effective configuration, or
// print the reference of every key.
#include <iostream>
#include <memory>
#include <sstream>

#include "common/log.h"
#include "launcher/commands.h"
#include "launcher/config/load.h"

namespace tandem::launcher {

void ConfigOptions::add_to(CLI::App* cmd) {
  cmd->add_option("-c,--config", path, "Job configuration (TOML); see docs/config.md");
  cmd->add_option("--set", overrides, "Override one key, e.g. --set kv.block_size=32 (repeatable)")
      ->type_name("SECTION.KEY=VALUE")
      ->allow_extra_args(false);
}

Config ConfigOptions::load() const { return load_config(path, overrides); }

void log_effective_config(const Config& config) {
  std::istringstream lines(to_toml(config));
  spdlog::info("effective configuration:");
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) spdlog::info("  {}", line);
}

Action add_config_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("config", "Check a job configuration and print it with every default filled in");
  auto opts = std::make_shared<ConfigOptions>();
  auto reference = std::make_shared<bool>(false);
  opts->add_to(cmd);
  cmd->add_flag("--reference", *reference, "Print the reference of every key (Markdown, as docs/config.md)");
  return [opts, reference]() {
    if (*reference) {
      std::cout << reference_markdown();
      return 0;
    }
    Config config = opts->load();
    std::cout << to_toml(config);
    return 0;
  };
}

}  // namespace tandem::launcher
