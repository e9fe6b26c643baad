// The cost of the KV store's model fingerprint, which hashes every byte of
// the weights (runtime/model/fingerprint.h), on a checkpoint given on the
// command line: against reading the same bytes without hashing them (the
// floor: what the file system gives), measured in the same run, each from
// the page cache (read once first). Then with the cache: the first job
// computes and stores each file's hash, later ones read none of the files.
//   fingerprint_bench MODEL_DIR   (e.g. tandem make-model --preset 0.6b --out m)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "runtime/model/fingerprint.h"
#include "runtime/model/model_config.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Reads every safetensors byte of `dir`, discarding it; returns the bytes read.
uint64_t read_all(const std::filesystem::path& dir) {
  std::vector<char> buf(std::size_t{8} << 20);
  uint64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    for (ssize_t n; fd >= 0 && (n = ::read(fd, buf.data(), buf.size())) > 0;) total += static_cast<uint64_t>(n);
    if (fd >= 0) ::close(fd);
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fingerprint_bench MODEL_DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const auto config = tandem::runtime::ModelConfig::load(dir);
  const uint64_t bytes = read_all(dir);  // into the page cache
  auto t0 = std::chrono::steady_clock::now();
  read_all(dir);
  const double read_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const std::string fp = tandem::runtime::model_fingerprint(dir, config);
  const double hash_s = seconds_since(t0);
  const auto cache = std::filesystem::temp_directory_path() / ("fingerprint-bench-" + std::to_string(::getpid()) + ".json");
  t0 = std::chrono::steady_clock::now();
  const std::string first = tandem::runtime::model_fingerprint(dir, config, cache);
  const double first_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const std::string cached = tandem::runtime::model_fingerprint(dir, config, cache);
  const double cached_s = seconds_since(t0);
  std::filesystem::remove(cache);
  std::filesystem::remove(cache.string() + ".lock");
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("weights: %.3f GB in %s\n", gb, dir.c_str());
  std::printf("read only (baseline, page cache): %.3f s, %.2f GB/s\n", read_s, gb / read_s);
  std::printf("fingerprint, every byte hashed:   %.3f s, %.2f GB/s, %.2fx the read\n", hash_s, gb / hash_s, hash_s / read_s);
  std::printf("fingerprint, first job (stores):  %.3f s\n", first_s);
  std::printf("fingerprint, later jobs (cached): %.4f s\n", cached_s);
  std::printf("fingerprints agree: %s (%s)\n", fp == first && first == cached ? "yes" : "NO", fp.c_str());
  return fp == first && first == cached ? 0 : 1;
}
