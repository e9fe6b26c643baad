#include "runtime/model/fingerprint.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "common/error.h"
#include "runtime/model/dtype.h"

namespace tandem::runtime {
namespace {

constexpr uint64_t kSamples = 16, kSampleBytes = 4096;  // per shard

void add(XXH3_state_t* st, std::string_view s) {
  const uint64_t n = s.size();
  XXH3_64bits_update(st, &n, sizeof n);  // length-prefixed: no two field lists hash alike by concatenation
  XXH3_64bits_update(st, s.data(), s.size());
}

}  // namespace

std::string model_fingerprint(const std::filesystem::path& dir, const ModelConfig& config) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto fail = [&](const std::filesystem::path& f, const std::string& why) {
    XXH3_freeState(st);
    throw Error(f.string() + ": " + why + " (needed for the KV store's model fingerprint)");
  };
  {
    std::ifstream in(dir / "config.json", std::ios::binary);
    if (!in) fail(dir / "config.json", "cannot be read");
    add(st, std::string((std::istreambuf_iterator<char>(in)), {}));
  }
  std::vector<std::filesystem::path> shards;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  for (const auto& f : shards) {
    std::ifstream in(f, std::ios::binary);
    uint64_t header = 0;
    if (!in.read(reinterpret_cast<char*>(&header), sizeof header) || header > (uint64_t{1} << 30))
      fail(f, "has no readable safetensors header");
    std::string meta(static_cast<std::size_t>(header), '\0');
    if (!in.read(meta.data(), static_cast<std::streamsize>(header))) fail(f, "has a truncated safetensors header");
    const auto size = static_cast<uint64_t>(std::filesystem::file_size(f, ec));
    add(st, f.filename().string());
    add(st, std::to_string(size));
    add(st, meta);
    // Same shapes, other values (a fine-tune, another seed): a sample of the
    // weights themselves tells them apart without reading them all.
    const uint64_t begin = 8 + header, span = size > begin ? size - begin : 0;
    std::string sample(static_cast<std::size_t>(std::min<uint64_t>(kSampleBytes, span)), '\0');
    for (uint64_t i = 0; i < kSamples && !sample.empty(); ++i) {
      in.seekg(static_cast<std::streamoff>(begin + (span - sample.size()) * i / (kSamples - 1)));
      if (!in.read(sample.data(), static_cast<std::streamsize>(sample.size()))) fail(f, "is shorter than its header says");
      add(st, sample);
    }
  }
  add(st, dtype_name(config.dtype));
  add(st, "kv:float32");
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace tandem::runtime
