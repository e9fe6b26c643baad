#include "router/loop/output_writer.h"

#include <algorithm>

namespace tandem::router {

void OutputWriter::put(uint64_t index, slurm::OutputKey key, std::string line) {
  if (!input_order_) return out_.write(key, line);
  buffer_.emplace(index, std::make_pair(std::move(key), std::move(line)));
  while (!buffer_.empty() && buffer_.begin()->first == next_) {
    if (!buffer_.begin()->second.second.empty()) out_.write(buffer_.begin()->second.first, buffer_.begin()->second.second);
    buffer_.erase(buffer_.begin());
    ++next_;
  }
}

void OutputWriter::commit() {
  out_.commit();
  last_commit_ = Clock::now();
}

void OutputWriter::maybe_commit(bool draining) {
  const double every = draining ? std::min(flush_seconds_, 1.0) : flush_seconds_;
  if (std::chrono::duration<double>(Clock::now() - last_commit_).count() >= every) commit();
}

}  // namespace tandem::router
