// Exactly-once output for jobs that get preempted, requeued or killed.
//
// The output is append-only JSONL. Next to it, `<output>.ckpt` records, at
// each commit, one record per line written since the last one (its key and
// the hash of the input line it answers, see OutputKey), then a commit
// record: the output's length in bytes and a checksum over the records
// before it and that length. Both files are fsync'd, the output first.
//
//   {"id":"q0","h":"9f0c…"}            a line answered: its custom_id, its input's hash
//   {"line":7,"h":"51aa…"}             one keyed by its line number (no usable custom_id)
//   {"committed_bytes":812,"records":2,"sum":"0d3e…"}
//
// The committed length is the truth: on resume the output is cut back to it
// (a torn last line from a SIGKILL, or lines written after the last commit,
// disappear) and exactly the committed records count as done, so every
// input line ends up in the output once. A record that does not match its
// commit's checksum, or a commit record that breaks the format, is damage
// (the file was changed outside Tandem): resuming refuses it with one line,
// since a skipped record would be done twice. Records after the last commit
// (a torn tail) are not done, as their output lines are cut away. Without
// resume, an existing non-empty output is an error: it is never overwritten
// or appended to silently. Not thread-safe: rank 0's loop owns it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
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
// a line number. With the key goes the hash of the input line's text
// (router/line_key.h): a resume takes the line as done only while the
// input holds that same text there.
struct OutputKey {
  std::string custom_id;    // empty for a line key
  uint64_t line = 0;        // 1-based line number, for a line key
  uint64_t input_hash = 0;  // of the input line's text
  bool has_input_hash = true;  // false only in checkpoints written before input hashes were recorded

  static OutputKey id(std::string custom_id, uint64_t input_hash) { return {std::move(custom_id), 0, input_hash, true}; }
  static OutputKey of_line(uint64_t line, uint64_t input_hash) { return {std::string(), line, input_hash, true}; }
  bool is_line() const { return custom_id.empty(); }
  // The key alone as 64 bits (ids and line numbers hashed in different domains).
  uint64_t key_hash() const;
  // The key and its input hash as 64 bits: what a done line is remembered by.
  uint64_t done_hash() const;
};

// The 64-bit hash (XXH3) by which a custom_id is remembered.
uint64_t custom_id_hash(std::string_view custom_id);

// The records of a checkpoint, in 10-15 bytes each: a key and its input
// hash kept as one 64-bit hash (OutputKey::done_hash). That is exact for
// the router's use: it keys a line by its custom_id only when no earlier
// line of the same input had an id with the same hash (router/line_key.h),
// so within one input a hash stands for one key. A record without an input
// hash (an older checkpoint) is kept by its key alone, and matches the key
// whatever the line holds.
class DoneKeys {
 public:
  void insert(const OutputKey& k) { k.has_input_hash ? exact_.insert(k.done_hash()) : by_key_.insert(k.key_hash()); }
  // Whether the line with this key and text was done.
  bool contains(const OutputKey& k) const { return exact_.contains(k.done_hash()) || by_key_.contains(k.key_hash()); }
  std::size_t size() const { return exact_.size() + by_key_.size(); }
  std::size_t without_input_hash() const { return by_key_.size(); }
  std::size_t memory_bytes() const { return exact_.memory_bytes() + by_key_.memory_bytes(); }

 private:
  U64Set exact_, by_key_;
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

// What a checkpoint holds once replayed (read_checkpoint).
struct CheckpointState {
  int64_t committed_bytes = 0;  // the output's committed length
  int64_t records = 0;          // committed records
  int64_t valid_bytes = 0;      // of the checkpoint: up to its last commit (or shard) record; the rest was not committed
  std::optional<OutputShard> shard;
};

// Replays `output_path`.ckpt (none: an empty state): calls on_record (when
// given) for every committed record, in order. Throws tandem::Error (one
// line naming the checkpoint, where it is damaged and the fix) when a
// committed record or a commit record is damaged.
CheckpointState read_checkpoint(const std::string& output_path,
                                const std::function<void(const OutputKey&)>& on_record = nullptr);

class ResumableOutput {
 public:
  // Throws tandem::Error (one line, naming the file and the fix). resume:
  // continue the output from its checkpoint (read_checkpoint tells what is
  // done; this cuts the output back to the committed length).
  ResumableOutput(const std::string& path, bool resume);
  ~ResumableOutput();
  ResumableOutput(const ResumableOutput&) = delete;
  ResumableOutput& operator=(const ResumableOutput&) = delete;

  // The array share recorded with this output, if any (see OutputShard).
  const std::optional<OutputShard>& recorded_shard() const { return shard_; }
  // Records it (durably), once; later jobs on this output read it back.
  void record_shard(const OutputShard& shard);

  // Appends one line (without its newline) for `key` (with its input's hash).
  void write(const OutputKey& key, const std::string& line);
  // Makes everything written so far durable, and marks it done.
  void commit();
  int64_t committed_bytes() const { return committed_; }
  const std::string& checkpoint_path() const { return ckpt_path_; }

 private:
  // The constructor's second half, with the checkpoint open and locked.
  void open_locked(bool resume, bool had_ckpt, bool has_output);

  std::string path_, ckpt_path_;
  std::FILE* out_ = nullptr;
  std::FILE* ckpt_ = nullptr;
  int64_t written_ = 0, committed_ = 0;
  // The records written since the last commit go to the checkpoint as
  // their lines are written (unsynced: records after the last commit are
  // not done), so memory does not grow with the lines between commits;
  // their count and checksum make the commit record.
  int64_t pending_ = 0;
  std::unique_ptr<class CommitSum> sum_;
  std::optional<OutputShard> shard_;
};

}  // namespace tandem::slurm
