// One-line, user-facing errors for configuration and start-up problems.
//
// Thrown by libraries when something a user controls is wrong (a config key, a
// model directory, a tokenizer file); caught in the launcher's main(), printed
// as one line and turned into a non-zero exit. The message says what is wrong,
// where (file:line:col, key or path) and how to fix it. Hot paths return a
// Status instead (common/status.h).
#pragma once

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tandem
