// Which lines a batch job answers: each line's checkpoint key, settled in
// input order (the first line with a custom_id is keyed by it, a repeat by
// its line number), and how many an earlier run answered already (resume),
// for the progress line's count of what is left.
#pragma once

#include <cstdint>
#include <memory>

#include "router/input_scan.h"
#include "router/line_key.h"
#include "router/loop/batch_input.h"

namespace tandem::router {

class LineLedger {
 public:
  // scan: what InputScan read before any work (null: nothing).
  explicit LineLedger(std::shared_ptr<const InputScan> scan) : scan_(std::move(scan)) {
    if (scan_) keys_.reserve(static_cast<std::size_t>(scan_->requests()));
  }
  // A line with a request (not blank, of this shard): its key, in input order.
  slurm::OutputKey settle(const PreparedLine& p) {
    ++lines_;
    return keys_.key(p.i, p.key_id, p.text_hash);
  }
  void answered_before() { ++resumed_; }
  int64_t resumed() const { return resumed_; }
  // The lines this run answers, and whether that count is final (the input
  // ended, or it was read through before any work); else a count so far.
  struct ToDo {
    int64_t lines = 0;
    bool known = false;
  };
  ToDo to_do(bool input_done) const {
    const bool known = input_done || (scan_ && scan_->requests() > 0);
    if (input_done || !known) return {lines_ - resumed_, known};
    return {static_cast<int64_t>(scan_->requests() - scan_->answered()), true};
  }

 private:
  std::shared_ptr<const InputScan> scan_;
  LineKeys keys_;
  int64_t lines_ = 0, resumed_ = 0;
};

}  // namespace tandem::router
