// safetensors checkpoints: memory-mapped reading of one file or of shards
// listed in model.safetensors.index.json, and writing (for make-model).
//
// Format: 8-byte little-endian header length N, N bytes of JSON mapping each
// tensor name to {dtype, shape, data_offsets: [begin, end)} relative to the
// end of the header, then the raw little-endian data.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/model/dtype.h"

namespace tandem::runtime {

// A read-only view of one tensor inside a mapped file. Valid while the
// Checkpoint that produced it lives.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::string file;  // shard it lives in, for messages

  int64_t numel() const;
  std::string shape_string() const;  // "[1024, 3072]"
};

class MappedFile;

// Every tensor of a checkpoint directory. Throws tandem::Error with one line
// naming the file on: no weights found, bad header, unsupported dtype, data
// beyond the end of the file (a truncated shard), a shard the index names
// but that is missing.
class Checkpoint {
 public:
  static std::unique_ptr<Checkpoint> open(const std::filesystem::path& model_dir);
  ~Checkpoint();

  // nullptr when absent.
  const TensorView* find(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // Drops this process's resident pages of bytes [p, p + n) when they lie in
  // one of the mapped files (whole pages only; a later read maps them in
  // again from the page cache). Does nothing for memory outside the files.
  void release(const void* p, std::size_t n) const;

 private:
  Checkpoint() = default;
  void add_file(const std::filesystem::path& path);

  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

// Writes one safetensors file from named tensors, in the order given.
struct TensorData {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian elements
};
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorData>& tensors);

// Writes one safetensors file a tensor at a time (memory bounded by what the
// caller holds): the header from the specs, then each tensor's bytes, in order.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& path, const std::vector<TensorSpec>& tensors);
  void write(const void* bytes, std::size_t n);  // the next bytes of the data, in the specs' order
  void finish();                                  // throws unless every tensor's bytes were written

 private:
  std::string path_;
  std::ofstream out_;
  uint64_t expected_ = 0, written_ = 0;
};

}  // namespace tandem::runtime
