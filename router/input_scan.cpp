#include "router/input_scan.h"

#include <sys/stat.h>

#include <chrono>
#include <functional>
#include <optional>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/u64_set.h"
#include "router/line_key.h"
#include "slurm/resumable_output.h"

namespace tandem::router {
namespace {

using Clock = std::chrono::steady_clock;

struct FileId {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{static_cast<uint64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

// Reads the input through. Every line of this share that carries a request
// is counted and, when keyed, visited with its key as the job keys it, in
// input order: visit(i, key).
struct Walked {
  uint64_t lines = 0, bytes = 0, requests = 0;
};

Walked walk(const InputScanOptions& o, bool keyed, const std::function<void(uint64_t, const slurm::OutputKey&)>& visit) {
  InputFile in(o.input, o.max_line_bytes);
  LineKeys keys;  // (grows as it reads: the count is what this pass finds)
  std::string text;
  uint64_t length = 0;
  Walked w;
  auto last_log = Clock::now();
  const auto count = static_cast<uint64_t>(std::max<int64_t>(o.shard_count, 1));
  for (InputFile::Got got; (got = in.next(text, length)) != InputFile::Got::kEnd; ++w.lines) {
    w.bytes += length + 1;
    if (Clock::now() - last_log > std::chrono::seconds(30)) {
      spdlog::info("checking the input before any work: {} lines read ({:.1f} MB)", w.lines, static_cast<double>(w.bytes) / 1e6);
      last_log = Clock::now();
    }
    const bool too_long = got == InputFile::Got::kTooLong;
    if (blank_line(text, too_long) || static_cast<int64_t>(w.lines % count) != o.shard_index) continue;
    ++w.requests;
    if (keyed) visit(w.lines, keys.key(w.lines, line_key_id(text), line_text_hash(text, length)));
  }
  return w;
}

std::string quoted(const slurm::OutputKey& k) {
  return k.is_line() ? "the answer to line " + std::to_string(k.line) + ", which had no usable custom_id"
                     : "custom_id '" + k.custom_id + "'";
}

// The failure's one line: which answered lines changed and which are gone, each with its first.
// Two more reads of the input and one of the checkpoint, on this path only.
std::string describe_mismatch(const InputScanOptions& o) {
  U64Set input_exact, input_keys;
  walk(o, true, [&](uint64_t, const slurm::OutputKey& k) {
    input_exact.insert(k.done_hash());
    input_keys.insert(k.key_hash());
  });
  uint64_t changed = 0, gone = 0;
  std::optional<slurm::OutputKey> first_changed, first_gone;
  slurm::read_checkpoint(o.output, [&](const slurm::OutputKey& k) {
    if (k.has_input_hash ? input_exact.contains(k.done_hash()) : input_keys.contains(k.key_hash())) return;
    if (input_keys.contains(k.key_hash())) {
      if (!changed++) first_changed = k;
    } else if (!gone++) {
      first_gone = k;
    }
  });
  std::string what;
  if (changed) {
    uint64_t at = 0;
    walk(o, true, [&](uint64_t i, const slurm::OutputKey& k) {
      if (!at && k.key_hash() == first_changed->key_hash()) at = i + 1;
    });
    what = std::to_string(changed) + " line(s) it answered hold other text there now (the first: line " +
           std::to_string(at) + ", " + quoted(*first_changed) + ")";
  }
  if (gone) {
    what += (what.empty() ? "" : ", and ") + std::to_string(gone) + " line(s) it answered are not there (the first: " +
            quoted(*first_gone) + ")";
  }
  return o.output + ": its answers are for another input than " + o.input + ": " + what +
         "; nothing was run. Resume with the input it was written for, or write this one to another output "
         "(docs/run.md, \"What --resume checks\")";
}

}  // namespace

std::shared_ptr<const InputScan> InputScan::run(const InputScanOptions& o) {
  const auto t0 = Clock::now();
  slurm::DoneKeys done;
  if (o.resume) slurm::read_checkpoint(o.output, [&](const slurm::OutputKey& k) { done.insert(k); });
  const bool keyed = done.size() > 0;
  const auto id = file_id(o.input);
  InputFile::Format format = InputFile::Format::kPlain;
  auto scan = std::make_shared<InputScan>();
  Walked w;
  try {
    {
      const InputFile in(o.input, o.max_line_bytes);
      format = in.format();
      if (!keyed && !o.read_through && format == InputFile::Format::kPlain) return nullptr;
      if (in.format() == InputFile::Format::kZstd && !in.checksummed())
        spdlog::warn("{}: its zstd data carries no checksum (written with --no-check), so damage to it cannot be "
                     "found; recompress it with zstd's default (checksums on)", o.input);
    }
    w = walk(o, keyed, [&](uint64_t i, const slurm::OutputKey& k) {
      if (!done.contains(k)) return;
      if (scan->done_.size() <= i / 64) scan->done_.resize(i / 64 + 1, 0);
      scan->done_[i / 64] |= uint64_t{1} << (i % 64);
      ++scan->answered_;
    });
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + kFoundBeforeWork);
  }
  scan->path_ = o.input;
  scan->format_ = format;
  if (id) scan->file_size_ = id->size, scan->mtime_ns_ = id->mtime_ns;
  scan->lines_ = w.lines;
  scan->requests_ = w.requests;
  scan->decoded_ = w.bytes;
  if (scan->answered_ < done.size()) throw Error(describe_mismatch(o));
  scan->seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
  if (done.without_input_hash() > 0)
    spdlog::warn("{}: {} of its answered lines were recorded by an older tandem, by custom_id alone: those are taken as "
                 "done without checking that the input still holds the same text", o.output + ".ckpt",
                 done.without_input_hash());
  return scan;
}

std::string InputScan::changed() const {
  const auto now = file_id(path_);
  if (now && now->size == file_size_ && now->mtime_ns == mtime_ns_) return "";
  return path_ + ": changed since it was read at start-up (its size or modification time differs); run the job again "
                 "once nothing writes to it";
}

}  // namespace tandem::router
