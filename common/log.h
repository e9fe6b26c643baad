// Logging for every rank: one spdlog logger writing to stderr (stdout carries
// data: token ids, JSONL), each line tagged "[rank N role]".
//
// Level: TANDEM_LOG_LEVEL in the environment wins over the config's log.level,
// so a job can be made verbose without editing its file. Not thread-safe to
// (re)configure; call init() and set_identity() from the main thread before
// starting workers. Logging itself is thread-safe.
#pragma once

#include <string>
#include <string_view>

#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>

namespace tandem::log {

// Levels accepted by log.level and TANDEM_LOG_LEVEL.
inline constexpr std::string_view kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};

// Sets up the logger at `config_level` (one of kLevels), or at
// TANDEM_LOG_LEVEL when that is set. Throws tandem::Error on an unknown level.
// `sink` replaces stderr (tests capture lines with it).
void init(std::string_view config_level, spdlog::sink_ptr sink = nullptr);

// Changes the "[rank N role]" tag, e.g. when the planner gives a rank a new role.
void set_identity(int rank, std::string_view role);

// The level actually in force, as a name from kLevels.
std::string current_level();

}  // namespace tandem::log
