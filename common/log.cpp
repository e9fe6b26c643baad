#include "common/log.h"

#include <cstdlib>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "common/error.h"

namespace tandem::log {
namespace {

spdlog::level::level_enum parse_level(std::string_view name, std::string_view where) {
  for (auto l : kLevels) {
    if (l == name) return spdlog::level::from_str(std::string(name == "warn" ? "warning" : name));
  }
  throw Error(std::string(where) + ": unknown log level '" + std::string(name) +
              "'; use one of trace, debug, info, warn, error, off");
}

void apply_pattern(int rank, std::string_view role) {
  std::string tag = "[rank " + std::to_string(rank) + " " + std::string(role) + "]";
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] " + tag + " [%^%l%$] %v");
}

}  // namespace

void init(std::string_view config_level, spdlog::sink_ptr sink) {
  spdlog::drop("tandem");
  auto logger = sink ? std::make_shared<spdlog::logger>("tandem", std::move(sink))
                     : spdlog::stderr_color_mt("tandem");
  spdlog::set_default_logger(logger);
  if (const char* env = std::getenv("TANDEM_LOG_LEVEL"); env && *env) {
    spdlog::set_level(parse_level(env, "TANDEM_LOG_LEVEL"));
  } else {
    spdlog::set_level(parse_level(config_level, "log.level"));
  }
  apply_pattern(0, "main");
}

void set_identity(int rank, std::string_view role) { apply_pattern(rank, role); }

std::string current_level() {
  auto l = spdlog::get_level();
  if (l == spdlog::level::warn) return "warn";
  auto sv = spdlog::level::to_string_view(l);
  return std::string(sv.data(), sv.size());
}

}  // namespace tandem::log
