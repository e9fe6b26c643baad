// Exactly-once output for jobs that get preempted, requeued or killed.
//
// The output is append-only JSONL. Next to it, `<output>.ckpt` records, at
// each commit, the keys of the lines written since the last one (see
// OutputKey), then the output's length in bytes, both fsync'd (output first). The
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
#include <string_view>
#include <vector>

#include "common/u64_set.h"

namespace tandem::slurm {

// What makes an output line "done" in the checkpoint: its request's
// custom_id, or, for a line without a usable one (unreadable, or an id an
// earlier line already has), its line number. The two kinds are recorded
// apart ({"id": ...} and {"line": N}), so no custom_id can ever be taken for
// a line number.
struct OutputKey {
  std::string custom_id;  // empty for a line key
  uint64_t line = 0;      // 1-based line number, for a line key

  static OutputKey id(std::string custom_id) { return {std::move(custom_id), 0}; }
  static OutputKey of_line(uint64_t line) { return {std::string(), line}; }
  bool is_line() const { return custom_id.empty(); }
};

// The 64-bit hash (XXH3) by which a custom_id is remembered.
uint64_t custom_id_hash(std::string_view custom_id);

// The keys found done in a checkpoint, in 10-15 bytes each: a custom_id is
// kept as its 64-bit hash. That is exact for the router's use: it keys a
// line by its custom_id only when no earlier line of the same input had an
// id with the same hash (see router_loop), so within one input a hash stands
// for one id.
class DoneKeys {
 public:
  void insert(const OutputKey& k) { k.is_line() ? lines_.insert(k.line) : ids_.insert(custom_id_hash(k.custom_id)); }
  bool contains(const OutputKey& k) const {
    return k.is_line() ? lines_.contains(k.line) : ids_.contains(custom_id_hash(k.custom_id));
  }
  std::size_t size() const { return ids_.size() + lines_.size(); }
  std::size_t memory_bytes() const { return ids_.memory_bytes() + lines_.memory_bytes(); }

 private:
  U64Set ids_, lines_;
};

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
  ResumableOutput(const std::string& path, bool resume, DoneKeys& done);
  ~ResumableOutput();
  ResumableOutput(const ResumableOutput&) = delete;
  ResumableOutput& operator=(const ResumableOutput&) = delete;

  // The array share recorded with this output, if any (see OutputShard).
  const std::optional<OutputShard>& recorded_shard() const { return shard_; }
  // Records it (durably), once; later jobs on this output read it back.
  void record_shard(const OutputShard& shard);

  // Appends one line (without its newline) for `key`.
  void write(const OutputKey& key, const std::string& line);
  // Makes everything written so far durable, and marks it done.
  void commit();
  int64_t committed_bytes() const { return committed_; }
  const std::string& checkpoint_path() const { return ckpt_path_; }

 private:
  // The constructor's second half, with the checkpoint open and locked.
  void open_locked(bool resume, bool had_ckpt, bool has_output, DoneKeys& done);

  std::string path_, ckpt_path_;
  std::FILE* out_ = nullptr;
  std::FILE* ckpt_ = nullptr;
  int64_t written_ = 0, committed_ = 0;
  std::vector<OutputKey> pending_;  // keys written since the last commit
  std::optional<OutputShard> shard_;
};

}  // namespace tandem::slurm
