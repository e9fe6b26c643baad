// A model's fingerprint for stored KV (kv/disk_store.h): KV computed by one
// checkpoint is valid only for the same checkpoint run the same way. It
// hashes config.json, every safetensors file's name, size and header (tensor
// names, dtypes, shapes, offsets: the weights' metadata), 16 samples of 4 KiB
// spread over each file's weights (a fine-tune has the same metadata, not the
// same values) and the dtype the weights are computed in.
#pragma once

#include <filesystem>
#include <string>

#include "runtime/model/model_config.h"

namespace tandem::runtime {

// 16 hex digits (XXH3-64). Throws tandem::Error (one line) when a file cannot be read.
std::string model_fingerprint(const std::filesystem::path& model_dir, const ModelConfig& config);

}  // namespace tandem::runtime
