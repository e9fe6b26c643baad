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
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace tandem::slurm {

// Why another job is writing `path` now (its checkpoint's lock is held), or
// "" — for a check before any work; the ResumableOutput takes the lock itself.
std::string output_in_use(const std::string& path);

// Which share of the input an array task wrote to an output (index of count;
// task: its SLURM_ARRAY_TASK_ID), recorded in the checkpoint by its first job.
struct OutputShard {
  int64_t task = -1, index = 0, count = 1;
};
// The share recorded for `path`, if its checkpoint has one.
std::optional<OutputShard> recorded_shard(const std::string& path);
// How a job that is shard `now` continues an output recorded as `recorded`:
// the same share, or one task resubmitted alone (a one-task array with the
// recorded task id) keeping the recorded share. Throws tandem::Error (one
// line) for any other change: it would take lines of another task's share.
OutputShard continue_shard(const OutputShard& recorded, const OutputShard& now, const std::string& path);

class ResumableOutput {
 public:
  // Throws tandem::Error (one line, naming the file and the fix).
  // done: filled with the keys already in the output when resuming.
  ResumableOutput(const std::string& path, bool resume, std::unordered_set<std::string>& done);
  ~ResumableOutput();
  ResumableOutput(const ResumableOutput&) = delete;
  ResumableOutput& operator=(const ResumableOutput&) = delete;

  // The array share recorded with this output, if any (see OutputShard).
  const std::optional<OutputShard>& recorded_shard() const { return shard_; }
  // Records it (durably), once; later jobs on this output read it back.
  void record_shard(const OutputShard& shard);

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
  std::optional<OutputShard> shard_;
};

}  // namespace tandem::slurm
