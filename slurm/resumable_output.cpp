#include "slurm/resumable_output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "common/error.h"

namespace tandem::slurm {
namespace {

void sync_file(std::FILE* f, const std::string& path) {
  if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0)
    throw Error(path + ": cannot write (" + std::strerror(errno) + "); is the disk full?");
}

std::string in_use_message(const std::string& path, const std::string& ckpt) {
  return path + ": another job is writing this output now (it holds " + ckpt +
         "'s lock); wait for it to end, or choose another output";
}

std::optional<OutputShard> shard_of(const nlohmann::json& record) {
  if (!record.is_object() || !record.contains("shard") || !record["shard"].is_object()) return std::nullopt;
  const auto& s = record["shard"];
  return OutputShard{s.value("task", int64_t{-1}), s.value("index", int64_t{0}), s.value("count", int64_t{1})};
}

// A key record of the checkpoint, if `record` is one. Checkpoints written
// before ids and lines were kept apart hold both as bare strings, a line as
// "#line:N"; they are read as they were meant.
std::optional<OutputKey> key_of(const nlohmann::json& record) {
  if (record.is_object() && record.size() == 1) {
    if (auto id = record.find("id"); id != record.end() && id->is_string()) return OutputKey::id(id->get<std::string>());
    if (auto line = record.find("line"); line != record.end() && line->is_number_unsigned())
      return OutputKey::of_line(line->get<uint64_t>());
    return std::nullopt;
  }
  if (!record.is_string()) return std::nullopt;
  const auto& legacy = record.get_ref<const std::string&>();
  constexpr std::string_view kLegacyLine = "#line:";
  if (legacy.size() > kLegacyLine.size() && legacy.starts_with(kLegacyLine) &&
      legacy.find_first_not_of("0123456789", kLegacyLine.size()) == std::string::npos)
    return OutputKey::of_line(std::stoull(legacy.substr(kLegacyLine.size())));
  return OutputKey::id(legacy);
}

nlohmann::json record_of(const OutputKey& k) {
  return k.is_line() ? nlohmann::json{{"line", k.line}} : nlohmann::json{{"id", k.custom_id}};
}

}  // namespace

uint64_t custom_id_hash(std::string_view custom_id) { return XXH3_64bits(custom_id.data(), custom_id.size()); }

std::optional<OutputShard> recorded_shard(const std::string& path) {
  // An array task records its share first thing (before any line is committed): the first record or none.
  std::ifstream in(path + ".ckpt");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  return shard_of(nlohmann::json::parse(line, nullptr, false));
}

OutputShard continue_shard(const OutputShard& recorded, const OutputShard& now, const std::string& path) {
  if (recorded.index == now.index && recorded.count == now.count) return now;
  if (now.count == 1 && now.task >= 0 && now.task == recorded.task) return recorded;  // resubmitted alone
  throw Error(path + ": was written by array task " + std::to_string(recorded.task) + " as shard " +
              std::to_string(recorded.index + 1) + " of " + std::to_string(recorded.count) + ", but this job is shard " +
              std::to_string(now.index + 1) + " of " + std::to_string(now.count) + "; resubmit that task alone (--array=" +
              std::to_string(recorded.task) + ") or the original --array range, or choose another output");
}

std::string output_in_use(const std::string& path) {
  const std::string ckpt = path + ".ckpt";
  const int fd = ::open(ckpt.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";  // no checkpoint: nobody is writing it
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // releases the probe's lock, if it got one
  return held ? in_use_message(path, ckpt) : "";
}

ResumableOutput::ResumableOutput(const std::string& path, bool resume, DoneKeys& done)
    : path_(path), ckpt_path_(path + ".ckpt") {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool has_output = fs::exists(path_) && fs::file_size(path_, ec) > 0;
  const bool had_ckpt = fs::exists(ckpt_path_);
  if (!resume && (has_output || had_ckpt)) {
    throw Error(path_ + ": the output already exists; pass --resume (or set job.resume = true) to continue it, "
                        "or choose another output");
  }
  if (resume && has_output && !had_ckpt)
    throw Error(path_ + ": has no checkpoint (" + ckpt_path_ + ") to resume from; move the output away or choose another");
  // One job at a time: the checkpoint is locked for the job's life (flock; on
  // a file system without locks, unlocked). A second job on the same output
  // (the same sbatch submitted twice: the scripts always resume) would cut
  // the first one's output back and interleave lines with it.
  const int fd = ::open(ckpt_path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(ckpt_path_ + ": cannot open the checkpoint (" + std::strerror(errno) + ")");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(fd);
    throw Error(in_use_message(path_, ckpt_path_));
  }
  ckpt_ = ::fdopen(fd, "a");
  if (!ckpt_) {
    ::close(fd);
    throw Error(ckpt_path_ + ": cannot open the checkpoint for appending (" + std::strerror(errno) + ")");
  }
  try {
    open_locked(resume, had_ckpt, has_output, done);
  } catch (...) {  // a constructor that throws runs no destructor: close, and leave no new checkpoint behind
    std::fclose(ckpt_);
    ckpt_ = nullptr;
    if (!had_ckpt) fs::remove(ckpt_path_, ec);
    throw;
  }
}

void ResumableOutput::open_locked(bool resume, bool had_ckpt, bool has_output, DoneKeys& done) {
  namespace fs = std::filesystem;
  if (resume && had_ckpt) {
    // Replay the checkpoint: keys become done at the commit record that follows them.
    std::ifstream in(ckpt_path_);
    std::vector<OutputKey> keys;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (auto key = key_of(j)) {
        keys.push_back(std::move(*key));
      } else if (auto shard = shard_of(j)) {
        shard_ = shard;
      } else if (j.is_object() && j.contains("committed_bytes")) {
        committed_ = j["committed_bytes"].get<int64_t>();
        for (const auto& k : keys) done.insert(k);
        keys.clear();
      }  // anything else is a torn last record: ignored, like the keys before it
    }
    const auto size = has_output ? static_cast<int64_t>(fs::file_size(path_)) : 0;
    if (size < committed_) {
      throw Error(path_ + ": is shorter (" + std::to_string(size) + " bytes) than its checkpoint records (" +
                  std::to_string(committed_) + "); it was changed outside Tandem — restore it or start a new output");
    }
    if (size > committed_) fs::resize_file(path_, static_cast<std::uintmax_t>(committed_));  // drop uncommitted lines
  }
  out_ = std::fopen(path_.c_str(), "a");
  if (!out_) throw Error(path_ + ": cannot open the output for appending (" + std::strerror(errno) + ")");
  written_ = committed_;
}

ResumableOutput::~ResumableOutput() {
  if (out_) std::fclose(out_);
  if (ckpt_) std::fclose(ckpt_);
}

void ResumableOutput::record_shard(const OutputShard& shard) {
  if (shard_) return;
  const nlohmann::json rec = {{"shard", {{"task", shard.task}, {"index", shard.index}, {"count", shard.count}}}};
  if (std::fputs((rec.dump() + "\n").c_str(), ckpt_) < 0)
    throw Error(ckpt_path_ + ": write failed (" + std::strerror(errno) + "); is the disk full?");
  sync_file(ckpt_, ckpt_path_);
  shard_ = shard;
}

void ResumableOutput::write(const OutputKey& key, const std::string& line) {
  if (std::fputs(line.c_str(), out_) < 0 || std::fputc('\n', out_) < 0)
    throw Error(path_ + ": write failed (" + std::strerror(errno) + "); is the disk full?");
  written_ += static_cast<int64_t>(line.size()) + 1;
  pending_.push_back(key);
}

void ResumableOutput::commit() {
  if (pending_.empty()) return;
  sync_file(out_, path_);  // the lines first: a checkpoint never promises what is not on disk
  std::string record;
  for (const auto& k : pending_) record += record_of(k).dump() + "\n";
  record += "{\"committed_bytes\":" + std::to_string(written_) + "}\n";
  if (std::fputs(record.c_str(), ckpt_) < 0) throw Error(ckpt_path_ + ": write failed (" + std::strerror(errno) + ")");
  sync_file(ckpt_, ckpt_path_);
  committed_ = written_;
  pending_.clear();
}

}  // namespace tandem::slurm
