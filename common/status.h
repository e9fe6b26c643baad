// Status: the result of an operation on a hot path or a transport, where an
// exception would be the wrong tool. [[nodiscard]], cheap when ok (no
// allocation), and it collects file:line as it propagates up through
// TANDEM_RETURN_IF_ERROR, so a failure prints its own backtrace (as NCCL does).
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace tandem {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller passed something wrong
  kNotFound,
  kOutOfRange,
  kResourceExhausted,  // out of blocks, memory, slots
  kUnavailable,        // a peer or device is not there (yet)
  kIoError,
  kCancelled,
  kInternal,  // a library (MPI, CUDA, ...) reported an error
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Appends " [at file:line]" so the propagation path is visible in the message.
  Status at(const char* file, int line) &&;
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace tandem

#define TANDEM_RETURN_IF_ERROR(expr)                             \
  do {                                                           \
    ::tandem::Status tandem_status_ = (expr);                    \
    if (!tandem_status_.ok())                                    \
      return std::move(tandem_status_).at(__FILE__, __LINE__);   \
  } while (0)
