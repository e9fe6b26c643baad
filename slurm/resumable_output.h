// Exactly-once output for jobs that get preempted, requeued or killed.
//
// The output is append-only JSONL. Next to it, `<output>.ckpt` records, at
// each commit, the keys (custom_ids) of the lines written since the last one,
// then the output's length in bytes, both fsync'd (output first). The
// committed length is the truth: on resume the output is cut back to it (a
// torn last line from a SIGKILL, or lines written after the last commit,
// disappear) and exactly the committed keys count as done, so every input
// line ends up in the output once. Without resume, an existing non-empty
// output is an error: it is never overwritten or appended to silently.
// Not thread-safe: rank 0's loop owns it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>

namespace tandem::slurm {

// Why another job is writing `path` now (its checkpoint's lock is held), or
// "" — for a check before any work; the ResumableOutput takes the lock itself.
std::string output_in_use(const std::string& path);

class ResumableOutput {
 public:
  // Throws tandem::Error (one line, naming the file and the fix).
  // done: filled with the keys already in the output when resuming.
  ResumableOutput(const std::string& path, bool resume, std::unordered_set<std::string>& done);
  ~ResumableOutput();
  ResumableOutput(const ResumableOutput&) = delete;
  ResumableOutput& operator=(const ResumableOutput&) = delete;

  // Appends one line (without its newline) for `key`.
  void write(const std::string& key, const std::string& line);
  // Makes everything written so far durable, and marks it done.
  void commit();
  int64_t committed_bytes() const { return committed_; }
  const std::string& checkpoint_path() const { return ckpt_path_; }

 private:
  // The constructor's second half, with the checkpoint open and locked.
  void open_locked(bool resume, bool had_ckpt, bool has_output, std::unordered_set<std::string>& done);

  std::string path_, ckpt_path_;
  std::FILE* out_ = nullptr;
  std::FILE* ckpt_ = nullptr;
  int64_t written_ = 0, committed_ = 0;
  std::vector<std::string> pending_;  // keys written since the last commit
};

}  // namespace tandem::slurm
