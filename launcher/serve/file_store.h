// The OpenAI Files API's store: http.batch_dir/files holds each file's bytes
// (<id>) and its record (<id>.json). An upload is written under a temporary
// name and renamed when whole, its record last, so a serve that is killed
// leaves every file complete or absent (leftover partial uploads are removed
// when a store opens the folder again). Safe to use from many threads.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::launcher {

struct StoredFile {
  std::string id;  // file-<24 hex digits>
  int64_t bytes = 0;
  int64_t created_at = 0;  // Unix seconds
  std::string filename, purpose;
};

// n random lowercase hex digits (for ids).
std::string random_hex(std::size_t n);
// Writes text to path whole: a temporary beside it (<path>.part), flushed to
// disk, then renamed; throws tandem::Error with one line when it cannot.
void write_whole(const std::filesystem::path& path, const std::string& text);

// The OpenAI file object.
nlohmann::json file_object(const StoredFile& f);

class FileStore {
 public:
  // The store in batch_dir/files, made by the first upload (throws tandem::Error with one line when
  // that path is not a folder).
  explicit FileStore(const std::filesystem::path& batch_dir);

  // One upload in progress: bytes go straight to disk. Destroyed without
  // commit(), it leaves nothing behind.
  class Upload {
   public:
    ~Upload();
    // False (and nothing more is kept) once the bytes would pass the limit, or the disk refuses them.
    bool write(const char* data, std::size_t n);
    bool too_large() const { return too_large_; }
    const std::string& io_error() const { return io_error_; }
    StoredFile commit(const std::string& filename, const std::string& purpose);

   private:
    friend class FileStore;
    Upload(FileStore& store, std::filesystem::path tmp, int64_t max_bytes);
    FileStore& store_;
    std::filesystem::path tmp_;
    std::FILE* f_ = nullptr;
    int64_t bytes_ = 0, max_bytes_;
    bool too_large_ = false, committed_ = false;
    std::string io_error_;
  };
  std::unique_ptr<Upload> begin(int64_t max_bytes);

  // Takes a finished file (a batch's output) into the store under `id`, by
  // rename (src must be on the same file system): a file of that id is
  // replaced, so a batch finalised again after a crash keeps its file ids.
  StoredFile adopt(const std::filesystem::path& src, const std::string& id, const std::string& filename,
                   const std::string& purpose);

  std::optional<StoredFile> get(const std::string& id) const;
  std::vector<StoredFile> list() const;  // newest first (ties: larger id first)
  bool remove(const std::string& id);
  std::filesystem::path content_path(const std::string& id) const { return dir_ / id; }

  // file-<24 lowercase hex digits>: anything else names no file (and no path).
  static bool valid_id(const std::string& id);

 private:
  std::filesystem::path dir_;
  mutable std::mutex mu_;
};

}  // namespace tandem::launcher
