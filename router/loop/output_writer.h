// The output order of a batch job: lines handed to the resumable output in
// completion order, or in input order through a reorder buffer; commits
// (fsync + checkpoint) at least every flush_seconds, every second while
// draining (the job may be killed any moment).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "slurm/resumable_output.h"

namespace tandem::router {

class OutputWriter {
 public:
  OutputWriter(slurm::ResumableOutput& out, bool input_order, double flush_seconds)
      : out_(out), input_order_(input_order), flush_seconds_(flush_seconds) {}
  void put(uint64_t index, slurm::OutputKey key, std::string line);
  // Input order: an index that produces no line (a blank or an already-done line) must still advance the order.
  void skip(uint64_t index) {
    if (input_order_) put(index, slurm::OutputKey(), std::string());
  }
  std::size_t buffered() const { return buffer_.size(); }
  void commit();
  void maybe_commit(bool draining);

 private:
  using Clock = std::chrono::steady_clock;
  slurm::ResumableOutput& out_;
  bool input_order_;
  double flush_seconds_;
  std::map<uint64_t, std::pair<slurm::OutputKey, std::string>> buffer_;
  uint64_t next_ = 0;
  Clock::time_point last_commit_ = Clock::now();
};

}  // namespace tandem::router
