#include "slurm/resumable_output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "common/error.h"

namespace tandem::slurm {

// A commit's checksum: over its records' lines (each with its newline), then its committed length.
class CommitSum {
 public:
  CommitSum() { reset(); }
  ~CommitSum() { XXH3_freeState(state_); }
  CommitSum(const CommitSum&) = delete;
  CommitSum& operator=(const CommitSum&) = delete;
  void reset() {
    if (!state_) state_ = XXH3_createState();
    if (!state_ || XXH3_64bits_reset(state_) != XXH_OK) throw std::bad_alloc();
  }
  void add_line(std::string_view line) {
    XXH3_64bits_update(state_, line.data(), line.size());
    XXH3_64bits_update(state_, "\n", 1);
  }
  // The checksum with the commit's length; reset() before the next commit's records.
  uint64_t finish(int64_t committed_bytes) {
    const std::string n = std::to_string(committed_bytes);
    XXH3_64bits_update(state_, n.data(), n.size());
    return XXH3_64bits_digest(state_);
  }

 private:
  XXH3_state_t* state_ = nullptr;
};

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

// A 64-bit value as the checkpoint writes it: 16 hex digits.
std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::optional<uint64_t> parse_hex64(const nlohmann::json& v) {
  if (!v.is_string() || v.get_ref<const std::string&>().size() != 16) return std::nullopt;
  const auto& s = v.get_ref<const std::string&>();
  uint64_t out = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return out;
}

// A key record of the checkpoint, if `record` is one: {"id"|"line", "h"}.
// Checkpoints written before input hashes hold {"id"} or {"line"} alone,
// and those before ids and lines were kept apart bare strings, a line as
// "#line:N"; they are read as they were meant, by their key alone.
std::optional<OutputKey> key_of(const nlohmann::json& record) {
  if (record.is_object() && (record.size() == 1 || (record.size() == 2 && record.contains("h")))) {
    std::optional<OutputKey> k;
    if (auto id = record.find("id"); id != record.end() && id->is_string() && !id->get_ref<const std::string&>().empty())
      k = OutputKey::id(id->get<std::string>(), 0);
    else if (auto line = record.find("line"); line != record.end() && line->is_number_unsigned())
      k = OutputKey::of_line(line->get<uint64_t>(), 0);
    if (!k) return std::nullopt;
    if (record.size() == 1) {
      k->has_input_hash = false;
      return k;
    }
    const auto h = parse_hex64(record["h"]);
    if (!h) return std::nullopt;
    k->input_hash = *h;
    return k;
  }
  if (!record.is_string() || record.get_ref<const std::string&>().empty()) return std::nullopt;
  const auto& legacy = record.get_ref<const std::string&>();
  constexpr std::string_view kLegacyLine = "#line:";
  OutputKey k = legacy.size() > kLegacyLine.size() && legacy.starts_with(kLegacyLine) &&
                        legacy.find_first_not_of("0123456789", kLegacyLine.size()) == std::string::npos
                    ? OutputKey::of_line(std::stoull(legacy.substr(kLegacyLine.size())), 0)
                    : OutputKey::id(legacy, 0);
  k.has_input_hash = false;
  return k;
}

std::string record_of(const OutputKey& k) {
  nlohmann::json j = k.is_line() ? nlohmann::json{{"line", k.line}} : nlohmann::json{{"id", k.custom_id}};
  j["h"] = hex64(k.input_hash);
  return j.dump();
}

std::string damaged(const std::string& ckpt, int64_t line, const std::string& what) {
  return ckpt + ": damaged at line " + std::to_string(line) + " (" + what +
         "): it was changed outside Tandem, and resuming from it could write lines twice or not at all; restore it "
         "from a copy, or move the output and its .ckpt away and start again";
}

}  // namespace

uint64_t custom_id_hash(std::string_view custom_id) { return XXH3_64bits(custom_id.data(), custom_id.size()); }

uint64_t OutputKey::key_hash() const {
  if (!is_line()) return custom_id_hash(custom_id);
  return XXH3_64bits_withSeed(&line, sizeof line, 0x6c696e65);  // "line": apart from every id's hash
}

uint64_t OutputKey::done_hash() const {
  const uint64_t k = key_hash();
  return XXH3_64bits_withSeed(&input_hash, sizeof input_hash, k);
}

CheckpointState read_checkpoint(const std::string& output_path, const std::function<void(const OutputKey&)>& on_record) {
  CheckpointState state;
  const std::string ckpt = output_path + ".ckpt";
  std::ifstream in(ckpt, std::ios::binary);
  if (!in) return state;
  // Records become done at the commit record that follows them, if it vouches for them.
  std::vector<OutputKey> group;
  int64_t group_size = 0;
  bool group_damaged = false;  // a line in it that is no record
  bool summed = false;         // a commit with a checksum was read
  int64_t damaged_line = 0, line_no = 0, commits = 0;
  CommitSum sum;
  std::string line;
  int64_t offset = 0;  // of the line after this one
  while (std::getline(in, line)) {
    ++line_no;
    if (in.eof()) break;  // no newline: a torn last record, never committed
    offset += static_cast<int64_t>(line.size()) + 1;
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("committed_bytes")) {
      ++commits;
      const auto& n = j["committed_bytes"];
      if (!n.is_number_integer() || n.get<int64_t>() < state.committed_bytes)
        throw Error(damaged(ckpt, line_no, "committed_bytes " + n.dump() + " is not a length at least the last one's (" +
                                               std::to_string(state.committed_bytes) + ")"));
      const int64_t bytes = n.get<int64_t>();
      if (group_damaged) throw Error(damaged(ckpt, damaged_line, "a line that is no checkpoint record"));
      if (j.contains("sum")) {  // since input hashes: the commit vouches for its records and its length
        const auto want = parse_hex64(j["sum"]);
        const auto count = j.value("records", nlohmann::json());
        if (!want || !count.is_number_unsigned() || count.get<int64_t>() != group_size || *want != sum.finish(bytes))
          throw Error(damaged(ckpt, line_no, "the records of commit " + std::to_string(commits) +
                                                 " do not match its checksum"));
        summed = true;
      } else if (summed) {  // an older checkpoint's commits come before any with a checksum, never after
        throw Error(damaged(ckpt, line_no, "a commit without its checksum after commits with one"));
      }
      state.committed_bytes = bytes;
      state.valid_bytes = offset;
      state.records += group_size;
      for (const auto& k : group) on_record(k);
      group.clear();
      group_size = 0;
      group_damaged = false;
      sum.reset();
      continue;
    }
    if (auto s = shard_of(j)) {
      state.shard = s;
      if (group_size == 0 && !group_damaged) state.valid_bytes = offset;
      continue;
    }
    sum.add_line(line);
    if (auto key = key_of(j)) {
      ++group_size;
      if (on_record) group.push_back(std::move(*key));  // kept only for on_record: a commit can vouch for millions
    } else if (!group_damaged) {
      group_damaged = true;
      damaged_line = line_no;
    }
  }
  // Records after the last commit are not done (their output lines are cut
  // away); a crash leaves them whole or torn in their last line, never a
  // whole line that is no record.
  if (group_damaged) throw Error(damaged(ckpt, damaged_line, "a line that is no checkpoint record"));
  return state;
}

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

ResumableOutput::ResumableOutput(const std::string& path, bool resume)
    : path_(path), ckpt_path_(path + ".ckpt"), sum_(std::make_unique<CommitSum>()) {
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
    open_locked(resume, had_ckpt, has_output);
  } catch (...) {  // a constructor that throws runs no destructor: close, and leave no new checkpoint behind
    std::fclose(ckpt_);
    ckpt_ = nullptr;
    if (!had_ckpt) fs::remove(ckpt_path_, ec);
    throw;
  }
}

void ResumableOutput::open_locked(bool resume, bool had_ckpt, bool has_output) {
  namespace fs = std::filesystem;
  if (resume && had_ckpt) {
    const CheckpointState state = read_checkpoint(path_);
    committed_ = state.committed_bytes;
    shard_ = state.shard;
    // Records after the last commit are not done: cut away, as their output lines are below, so that this
    // job's records follow the last commit (a torn one would otherwise join the next record on its line).
    if (::ftruncate(::fileno(ckpt_), static_cast<off_t>(state.valid_bytes)) != 0)
      throw Error(ckpt_path_ + ": cannot cut back its uncommitted records (" + std::strerror(errno) + ")");
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
  const std::string r = record_of(key);
  sum_->add_line(r);
  if (std::fputs((r + "\n").c_str(), ckpt_) < 0)
    throw Error(ckpt_path_ + ": write failed (" + std::strerror(errno) + "); is the disk full?");
  ++pending_;
}

void ResumableOutput::commit() {
  if (pending_ == 0) return;
  sync_file(out_, path_);  // the lines first: a checkpoint never promises what is not on disk
  const std::string record = "{\"committed_bytes\":" + std::to_string(written_) + ",\"records\":" +
                             std::to_string(pending_) + ",\"sum\":\"" + hex64(sum_->finish(written_)) + "\"}\n";
  if (std::fputs(record.c_str(), ckpt_) < 0) throw Error(ckpt_path_ + ": write failed (" + std::strerror(errno) + ")");
  sync_file(ckpt_, ckpt_path_);
  committed_ = written_;
  pending_ = 0;
  sum_->reset();
}

}  // namespace tandem::slurm
