// A model's fingerprint for stored KV (kv/disk_store.h): KV computed by one
// checkpoint is valid only for the same checkpoint run the same way. It
// hashes config.json, every safetensors file's name, size and every byte
// of it (a fine-tune that changes one layer's k_proj has the same names,
// shapes and sizes, and other KV), the dtype the weights are computed in, how
// they were converted as they loaded (model.dtype) and the CPU's product
// arithmetic (model.cpu_matmul): KV stored under one is never read under another.
//
// Reading every byte of a large checkpoint costs time (measured: perf/
// fingerprint_bench), so each file's hash is cached in `cache_file`, keyed
// by the file's canonical path, size and modification time: a later job on
// the same files reads none of them again. Ranks that share the cache
// compute a file's hash one at a time (a lock beside the cache), so the
// first computes and the others find it. The cache is only a cache: when
// it cannot be read or written, the hash is computed.
#pragma once

#include <filesystem>
#include <string>

#include "runtime/model/model_config.h"

namespace tandem::runtime {

// 16 hex digits (XXH3-64). Throws tandem::Error (one line) when a file cannot be read.
std::string model_fingerprint(const std::filesystem::path& model_dir, const ModelConfig& config,
                              const std::filesystem::path& cache_file = {});

// XXH3-64 of a whole file, read in large chunks. Throws tandem::Error when it cannot be read.
uint64_t file_content_hash(const std::filesystem::path& file);

}  // namespace tandem::runtime
