// The OpenAI Batches API's records: http.batch_dir/batches/<id>.json holds a
// batch's state (status, its times, request_counts, usage, its output and
// error files), replaced whole at every change (written beside it, flushed
// to disk, renamed); batches/<id>/ is its work folder while it runs: a hard
// link to its input file (a deleted input file does not stop it) and the
// resumable output (slurm/resumable_output.h), which the finished batch
// splits into its output and error files. A serve started again on the
// same folder finds every unfinished batch here. Records are read from disk
// at every look (a server that does not run the folder's batches sees the
// running one's). Safe to use from many threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::launcher {

// What a batch has done, as its output's last commit says.
struct BatchCounts {
  int64_t total = 0, completed = 0, failed = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  int64_t committed_bytes = 0;  // of its output: the lines these counts cover
};

struct BatchRecord {
  std::string id;  // batch_<24 hex digits>
  std::string endpoint, input_file_id, completion_window, status;
  nlohmann::json metadata;  // null, or an object of strings
  int64_t created_at = 0, expires_at = 0;
  std::map<std::string, int64_t> times;  // in_progress_at, finalizing_at, completed_at, ... (unix seconds)
  std::string output_file_id, error_file_id;
  nlohmann::json errors;  // null, or [{code, message, line, param}]
  BatchCounts counts;

  // Neither done nor failed: a serve started again takes it up.
  bool unfinished() const;
};

// The OpenAI batch object.
nlohmann::json batch_object(const BatchRecord& b);

class BatchStore {
 public:
  // The records in batch_dir/batches (a record that does not parse is skipped with a warning).
  explicit BatchStore(const std::filesystem::path& batch_dir);
  // Tidies the folder: a killed server's half-written records, work folders
  // of batches that ended (a failed one's kept). Only by the server that
  // holds the folder (batch_runner.h): another one's writes are never swept.
  void sweep();

  // Writes the record whole (the folder made on the first), and keeps it; throws tandem::Error when the disk refuses.
  void save(const BatchRecord& b);
  std::optional<BatchRecord> get(const std::string& id) const;
  std::vector<BatchRecord> list() const;  // newest first (ties: larger id first)
  std::filesystem::path work_dir(const std::string& id) const { return dir_ / id; }

  static std::string new_id();
  // batch_<24 lowercase hex digits>: anything else names no batch (and no path).
  static bool valid_id(const std::string& id);

 private:
  std::optional<BatchRecord> read(const std::string& id) const;  // under mu_

  std::filesystem::path dir_;
  mutable std::mutex mu_;
};

}  // namespace tandem::launcher
