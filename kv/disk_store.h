// G3: the persistent prefix store, a directory of HDF5 files on a shared
// filesystem that any rank of any later job can read.
//
// Each writing process appends to its own file, named
// kv-<time>-<host>-<pid>-<n>.h5; while open it is "<name>.part" and only its
// writer reads it. It is renamed to .h5 when closed, and also every
// roll_seconds of writing, so a job killed outright loses at most that much
// of what it stored. A later job opens every *.h5 file read-only and indexes
// it by its /hash dataset: the index is in the files, no separate file to
// keep consistent. Layout of one file:
//   /kv        float32 [n][layers][2][kv_heads][block_size][head_dim]  (block-major, head-major inside, as the pool;
//              bf16: its bits as uint16; FP8: uint8 [...][block_size][head_dim + 4], each row's E4M3 codes then
//              its scale, float32 little-endian)
//   /hash      uint64  [n]  chained block hash (block_hash.h) of row i
//   /checksum  uint64  [n]  XXH3-64 of row i's bytes seeded with its /hash, checked on every read
//   attributes: format "tandem-kv-store", layout_version, model_fingerprint,
//               model, dtype "float32" | "bfloat16" | "float8_e4m3fn+scale", block_size, layers, kv_heads,
//               head_dim, blocks (rows written completely; later rows are ignored)
//
// Size: past max_bytes, whole files go, least recently used first (a read
// sets a file's modification time). A store written for another model
// (fingerprint or layout differs) is not
// used at all; an unreadable or truncated file is skipped; a block failing its
// checksum is a miss (recomputed) and its file is dropped. Each problem is one
// warning line, never an exception: the job then runs colder, never wrong.
// Not thread-safe: one thread (KvTiers' I/O thread) owns it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/h5_check.h"
#include "kv/kv_layout.h"

namespace tandem::kv {

// The store's version: 5 float32, 6 bf16, 7 FP8 with row scales, head-major ([layers][2][kv_heads][block_size][head_dim]), each
// row's checksum over its block hash and its data. 3 and 4 checksummed the data alone (before 2026-12-03);
// 1 and 2 were token-major ([layers][2][block_size][kv_heads][head_dim]), before 2026-12-02.
inline constexpr int64_t kStoreLayoutVersion = 5;

// What makes stored KV valid for a job: the same model and the same block layout.
struct StoreIdentity {
  std::string fingerprint;  // hex of a hash over config.json, the weights' metadata and dtype
  std::string model;        // for messages: architecture and where it was loaded from
  KvLayout layout;
};

class DiskStore {
 public:
  struct Options {
    std::filesystem::path dir;
    StoreIdentity id;
    double roll_seconds = 60;  // a file being written is finished and a new one started this often
    int64_t max_bytes = 0;     // past this size the least recently used files go (to 90%); 0: no limit
  };
  // Opens (creating) the directory and indexes its finished files. Never
  // throws: each problem appends one line to `warnings` and the store is then
  // read-only, or off.
  DiskStore(Options options, std::vector<std::string>& warnings);
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  bool enabled() const { return enabled_; }
  bool writable() const { return enabled_ && writable_; }
  bool contains(uint64_t hash) const { return where_.count(hash) > 0; }
  int64_t blocks() const { return static_cast<int64_t>(where_.size()); }
  int64_t files_read() const { return files_read_; }  // finished files indexed at open
  // Files deleted to stay under max_bytes, and their bytes.
  int64_t pruned_files() const { return pruned_files_; }
  int64_t pruned_bytes() const { return pruned_bytes_; }
  // Every hash the store holds now.
  std::vector<uint64_t> hashes() const;

  // Copies the block into dst (layout.block_floats() floats). False when absent
  // or when its file fails; then `warning` (if empty) gets one line and the
  // file's blocks leave the index.
  bool read(uint64_t hash, float* dst, std::string& warning);
  // Appends blocks hashes[i] at data + i * block_floats to this process's file.
  // False with one line in `warning` when it cannot (permission, disk full,
  // size limit); writing then stops for the rest of the job.
  bool write(std::span<const uint64_t> hashes, const float* data, std::string& warning);
  // Finishes the file being written (renamed to .h5, visible to later jobs).
  void close();

 private:
  struct File {
    std::filesystem::path path;
    H5Id file, kv;
    std::vector<uint64_t> checksums;
    bool writing = false;
    bool touched = false;  // its modification time was set to now by a read (once per job)
  };
  void prune(int64_t need);
  void index_file(const std::filesystem::path& path, std::vector<std::string>& warnings, bool& foreign);
  bool start_file(std::string& warning);
  void finish_file();
  void drop_file(std::size_t f);
  std::string describe() const;

  Options o_;
  bool enabled_ = false, writable_ = false;
  std::vector<File> files_;
  std::unordered_map<uint64_t, std::pair<std::size_t, int64_t>> where_;  // hash -> (file, row)
  int64_t files_read_ = 0;
  int64_t bytes_ = 0;  // size of the store's files, as far as this process knows
  int64_t pruned_files_ = 0, pruned_bytes_ = 0;
  // The file being written: index in files_ (or -1), rows, when it started.
  int64_t current_ = -1;
  int64_t rows_ = 0;
  double started_ = 0;
  H5Id hash_set_, checksum_set_;
};

}  // namespace tandem::kv
