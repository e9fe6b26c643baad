// Loading a job's configuration: TOML file, then `--set section.key=value`
// overrides in order, each validated against the schema.
//
// Every problem throws tandem::Error with one line: where (file:line:col, or
// the --set argument), the key, what was expected, and a "did you mean" for
// near-miss names. Nothing is partially applied: a throw leaves no Config.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "launcher/config/config.h"

namespace tandem::launcher {

// path empty: defaults only. overrides: "section.key=value", applied after the file.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// As load_config, from text; source_name stands for the file in messages.
Config parse_config(std::string_view toml_text, std::string_view source_name,
                    const std::vector<std::string>& overrides = {});

// The effective configuration as TOML, every key with its value.
std::string to_toml(const Config& config);

// The Markdown reference of every key (docs/config.md is this text).
std::string reference_markdown();

}  // namespace tandem::launcher
