// The batch file as the front end takes it: lines read in order (plain,
// gzip or zstd, none kept past job.max_line_bytes), prepared off the main
// thread by helpers (parsed, the prompt built and tokenized, its blocks
// hashed), handed out in input order; and, for the planner, an epoch's
// lines read ahead and kept for admission. Lines of another array task's
// shard, blank lines and lines an earlier run answered (resume) come out
// marked, unparsed.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/ordered_pool.h"
#include "router/batch_request.h"
#include "router/input_file.h"
#include "router/input_scan.h"
#include "router/prompt_builder.h"

namespace tandem::router {

// An input line as read: its text (only the first InputFile::kKeptPrefix
// bytes when too long) and its length.
struct Line {
  std::string text;
  uint64_t length = 0;
  bool too_long = false;
};

// An input line prepared off the main thread: parsed, its prompt built
// (tokenized) and its blocks hashed, unless it is blank, another array
// task's, or a request an earlier run finished (resume).
struct PreparedLine {
  uint64_t i = 0;  // 0-based line index
  Line line;       // its text is dropped once parsed
  std::size_t bytes = 0;
  bool skip = false;       // blank, or another shard's
  bool done = false;       // answered by an earlier run (resume): not parsed
  std::string key_id;      // line_key_id of its text
  uint64_t text_hash = 0;  // line_text_hash of its text
  ParsedLine parsed;
  std::optional<std::variant<std::vector<int32_t>, LineError>> prompt;
  std::vector<uint64_t> hashes;  // the prompt's full blocks, when reordering
  // The tokens of a request with a prompt (null for bad lines, done or skipped ones).
  const std::vector<int32_t>* ids() const {
    return skip || done || line.too_long || !prompt ? nullptr : std::get_if<std::vector<int32_t>>(&*prompt);
  }
};

struct InputShard {
  int64_t index = 0, count = 1;  // this job takes lines i with i % count == index
  bool has(uint64_t i) const { return static_cast<int64_t>(i % static_cast<uint64_t>(count)) == index; }
};

class BatchInput {
 public:
  struct Options {
    std::string path;
    int64_t max_line_bytes = 1 << 20;
    int tokenize_threads = 0;  // 0: the caller's thread prepares each line
    const PromptContext* prompts = nullptr;
    int64_t block_size = 16;
    bool hash_blocks = false;  // the prompt's full block hashes (a reorder window groups by them)
    const BodyDefaults* defaults = nullptr;  // the job's fields under every line's body; null: none
  };
  // scan: which lines an earlier run answered (null: none).
  BatchInput(Options o, std::shared_ptr<const InputScan> scan, InputShard shard);

  // The next line in input order, prepared (a line read ahead first); false
  // at the input's end, or at a read error (error()).
  bool next(PreparedLine& p);
  // Reads and prepares lines ahead until `n` wait (or the input ends, or
  // stop() says so); those lines, in input order, come out of next() first.
  const std::deque<PreparedLine>& read_ahead(int64_t n, const std::function<bool()>& stop);
  // A read error or bad compressed data ends the input where it is ("" when none).
  const std::string& error() const { return error_; }
  InputFile::Format format() const { return in_.format(); }

 private:
  bool read_line(Line& l);
  void prepare(PreparedLine& p) const;  // on a helper thread: nothing of the main thread's state
  void fill_pool();
  PreparedLine pop();

  Options o_;
  InputFile in_;
  std::shared_ptr<const InputScan> scan_;
  InputShard shard_;
  std::string error_;
  uint64_t read_index_ = 0;  // the next line to read
  bool reading_done_ = false;
  std::size_t pool_bytes_ = 0;    // of the lines in the pool
  std::deque<PreparedLine> ahead_;  // an epoch's lines read ahead for the planner
  std::optional<OrderedPool<PreparedLine>> pool_;  // last: its helpers read the members above
};

}  // namespace tandem::router
