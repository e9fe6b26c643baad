// The KV store's model fingerprint covers every byte of the weights, and
// its cache is keyed by each file's path, size and modification time.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <catch2/catch.hpp>

#include "runtime/model/fingerprint.h"

namespace fs = std::filesystem;
using tandem::runtime::model_fingerprint;

namespace {

void set_mtime(const fs::path& f, int64_t sec) {
  const timespec t[2] = {{sec, 0}, {sec, 0}};
  REQUIRE(::utimensat(AT_FDCWD, f.c_str(), t, 0) == 0);
}

void flip(const fs::path& f, std::size_t at) {
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(at));
  const char c = static_cast<char>(io.get());
  io.seekp(static_cast<std::streamoff>(at));
  io.put(static_cast<char>(c ^ 1));
}

}  // namespace

TEST_CASE("the model fingerprint changes with any byte of the weights, and its cache with the file", "[runtime]") {
  const fs::path dir = fs::temp_directory_path() / ("tandem-fp-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << "{}";
  std::string bytes(3 << 20, '\0');
  std::mt19937 rng(4);
  for (auto& c : bytes) c = static_cast<char>(rng());
  const fs::path weights = dir / "model.safetensors";
  std::ofstream(weights, std::ios::binary) << bytes;
  set_mtime(weights, 1000);
  const tandem::runtime::ModelConfig config;
  const std::string base = model_fingerprint(dir, config);
  // One bit in the middle: the names, sizes and header are the same, the fingerprint is not.
  flip(weights, (3 << 20) / 2 + 17);
  set_mtime(weights, 1000);
  const std::string tuned = model_fingerprint(dir, config);
  CHECK(tuned != base);
  flip(weights, (3 << 20) / 2 + 17);
  set_mtime(weights, 1000);
  CHECK(model_fingerprint(dir, config) == base);
  // The same files run another way give other KV: weights converted as they load, bf16 dot products.
  tandem::runtime::ModelConfig converted = config, bf16dot = config, fp8_units = config;
  converted.load_as = "fp8";
  bf16dot.cpu_matmul = "bf16";
  fp8_units.gpu_matmul = "fp8";  // activations quantized for the FP8 tensor cores
  CHECK(model_fingerprint(dir, converted) != base);
  CHECK(model_fingerprint(dir, bf16dot) != base);
  CHECK(model_fingerprint(dir, bf16dot) != model_fingerprint(dir, converted));
  CHECK(model_fingerprint(dir, fp8_units) != base);
  CHECK(model_fingerprint(dir, fp8_units) != model_fingerprint(dir, bf16dot));
  // Cached: stored by the first call, found by the next (the file is not read: a change that keeps its
  // size and modification time is not seen, which no tool that writes the file does).
  const fs::path cache = dir / "cache" / "weight-hashes.json";
  fs::create_directories(cache.parent_path());
  CHECK(model_fingerprint(dir, config, cache) == base);
  REQUIRE(fs::exists(cache));
  flip(weights, 5);
  set_mtime(weights, 1000);
  CHECK(model_fingerprint(dir, config, cache) == base);
  set_mtime(weights, 2000);  // written again: a new modification time
  CHECK(model_fingerprint(dir, config, cache) != base);
  CHECK(model_fingerprint(dir, config, cache) == model_fingerprint(dir, config));
  // An unreadable or foreign cache is only a miss.
  std::ofstream(cache) << "not json";
  CHECK(model_fingerprint(dir, config, cache) == model_fingerprint(dir, config));
  fs::remove_all(dir);
}
