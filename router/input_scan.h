// What rank 0 reads of the input before any rank starts work, when it must:
//  - compressed input is read through: gzip and zstd check their data only
//    at the end of each member or frame (CRC-32, XXH64), after the damaged
//    bytes were already decoded, so a damaged file stops the job before any
//    line decoded from it is run (instead of answering garbage and stopping
//    half-way);
//  - on --resume, every line is keyed as the job keys it (router/line_key.h)
//    and matched against the output's checkpoint: each answered line must
//    still be in the input with the text it had, and each record must be a
//    line of it, else the job stops before any work, saying what differs
//    (the output answers another input; mixing the two would keep answers to
//    prompts no longer asked).
// The result says which lines are answered already, a bit a line, for the
// job to skip. No MPI; rank 0 only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "router/input_file.h"

namespace tandem::router {

struct InputScanOptions {
  std::string input, output;
  int64_t max_line_bytes = 1 << 20;
  bool resume = false;
  int64_t shard_index = 0, shard_count = 1;  // the job array task's share: lines i with i % count == index
  bool read_through = false;  // read a plain input through even when nothing is done yet (to count its requests)
};

class InputScan {
 public:
  // Ends an input's error found by the checks before any work.
  static constexpr const char* kFoundBeforeWork = " (found before any work: nothing was run)";

  // Reads the input through when it must (compressed, or resuming an output
  // with committed lines); nullptr when it need not. Throws tandem::Error
  // (one line: what, where, the fix) on damaged input, a damaged
  // checkpoint, or an input that differs from the one the output answers.
  static std::shared_ptr<const InputScan> run(const InputScanOptions& o);

  // Whether line i (0-based) is answered in the output already.
  bool done(uint64_t i) const { return i / 64 < done_.size() && (done_[i / 64] >> (i % 64) & 1) != 0; }
  uint64_t lines() const { return lines_; }        // every line of the input, blank ones too
  uint64_t requests() const { return requests_; }  // lines of this share that carry a request
  uint64_t answered() const { return answered_; }  // of those, done already
  uint64_t decoded_bytes() const { return decoded_; }
  InputFile::Format format() const { return format_; }
  double seconds() const { return seconds_; }
  // "" while the input is the file that was read (size and modification
  // time); else a line saying it changed since.
  std::string changed() const;

 private:
  std::string path_;
  uint64_t file_size_ = 0;
  int64_t mtime_ns_ = 0;
  uint64_t lines_ = 0, requests_ = 0, answered_ = 0, decoded_ = 0;
  double seconds_ = 0;
  InputFile::Format format_ = InputFile::Format::kPlain;
  std::vector<uint64_t> done_;  // a bit a line
};

}  // namespace tandem::router
