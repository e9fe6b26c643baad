#include "common/status.h"

#include <cstring>

namespace tandem {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kOutOfRange: return "out of range";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

Status Status::at(const char* file, int line) && {
  const char* base = std::strrchr(file, '/');
  message_ += " [at ";
  message_ += base ? base + 1 : file;
  message_ += ':';
  message_ += std::to_string(line);
  message_ += ']';
  return std::move(*this);
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace tandem
