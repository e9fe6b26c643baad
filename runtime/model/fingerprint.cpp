#include "runtime/model/fingerprint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/model/dtype.h"

namespace tandem::runtime {
namespace {

void add(XXH3_state_t* st, std::string_view s) {
  const uint64_t n = s.size();
  XXH3_64bits_update(st, &n, sizeof n);  // length-prefixed: no two field lists hash alike by concatenation
  XXH3_64bits_update(st, s.data(), s.size());
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// What identifies a file's content without reading it: its canonical path, size and modification time.
struct FileStamp {
  std::string path;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

std::optional<FileStamp> stamp_of(const std::filesystem::path& f) {
  struct stat st {};
  if (::stat(f.c_str(), &st) != 0) return std::nullopt;
  std::error_code ec;
  const auto canonical = std::filesystem::canonical(f, ec);
  return FileStamp{ec ? f.string() : canonical.string(), static_cast<uint64_t>(st.st_size),
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

// The cache: {"files": {path: {"size", "mtime_ns", "xxh3"}}}, rewritten whole by rename.
class HashCache {
 public:
  explicit HashCache(std::filesystem::path file) : file_(std::move(file)) {}

  std::optional<uint64_t> find(const FileStamp& s) {
    if (file_.empty()) return std::nullopt;
    load();
    const auto it = files_.find(s.path);
    if (it == files_.end() || !it->is_object() || it->value("size", uint64_t{0}) != s.size ||
        it->value("mtime_ns", int64_t{0}) != s.mtime_ns)
      return std::nullopt;
    const std::string h = it->value("xxh3", std::string());
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(h.data(), h.data() + h.size(), v, 16);
    if (ec != std::errc() || end != h.data() + h.size() || h.size() != 16) return std::nullopt;
    return v;
  }

  void store(const FileStamp& s, uint64_t hash) {
    if (file_.empty()) return;
    load();
    files_[s.path] = {{"size", s.size}, {"mtime_ns", s.mtime_ns}, {"xxh3", hex(hash)}};
    const std::string tmp = file_.string() + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary);
      if (!out) return;  // not writable here: computed again next time
      out << nlohmann::json{{"format", "tandem-weight-hashes"}, {"files", files_}}.dump(1) << "\n";
      if (!out) return;
    }
    std::error_code ec;
    std::filesystem::rename(tmp, file_, ec);
    if (ec) std::filesystem::remove(tmp, ec);
  }

 private:
  void load() {
    files_ = nlohmann::json::object();
    std::ifstream in(file_, std::ios::binary);
    if (!in) return;
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_object() && j.value("format", "") == "tandem-weight-hashes" && j.contains("files") && j["files"].is_object())
      files_ = j["files"];
  }

  std::filesystem::path file_;
  nlohmann::json files_ = nlohmann::json::object();
};

// An exclusive lock beside the cache for as long as it lives (none where the file system has no locks).
class CacheLock {
 public:
  explicit CacheLock(const std::filesystem::path& cache) {
    if (cache.empty()) return;
    fd_ = ::open((cache.string() + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~CacheLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

uint64_t file_content_hash(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(file.string() + ": cannot be read (" + std::strerror(errno) + ")");
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(std::size_t{8} << 20);
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      XXH3_freeState(st);
      ::close(fd);
      throw Error(file.string() + ": cannot be read (" + std::strerror(err) + ")");
    }
    XXH3_64bits_update(st, buf.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

std::string model_fingerprint(const std::filesystem::path& dir, const ModelConfig& config,
                              const std::filesystem::path& cache_file) {
  const std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), XXH3_freeState);
  XXH3_state_t* st = state.get();
  XXH3_64bits_reset(st);
  const std::string why = " (needed for the KV store's model fingerprint)";
  {
    std::ifstream in(dir / "config.json", std::ios::binary);
    if (!in) throw Error((dir / "config.json").string() + ": cannot be read" + why);
    add(st, std::string((std::istreambuf_iterator<char>(in)), {}));
  }
  std::vector<std::filesystem::path> shards;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  HashCache cache(cache_file);
  for (const auto& f : shards) {
    const auto stamp = stamp_of(f);
    if (!stamp) throw Error(f.string() + ": cannot be read" + why);
    std::optional<uint64_t> content = cache.find(*stamp);
    if (!content) {
      const CacheLock lock(cache_file);  // another rank may be computing it: wait, then look again
      content = cache.find(*stamp);
      if (!content) {
        try {
          content = file_content_hash(f);
        } catch (const Error& e) {
          throw Error(e.what() + why);
        }
        cache.store(*stamp, *content);
      }
    }
    add(st, f.filename().string());
    add(st, std::to_string(stamp->size));
    add(st, hex(*content));
  }
  add(st, dtype_name(config.dtype));
  if (config.load_as != "auto") add(st, "as:" + config.load_as);  // model.dtype changes the weights computed with
  if (config.cpu_matmul != "f32") add(st, "matmul:" + config.cpu_matmul);  // and bf16 dot products the KV's bits
  if (config.gpu_matmul != "auto") add(st, "gpu_matmul:" + config.gpu_matmul);  // as do quantized activations
  add(st, "kv:float32");
  add(st, "swiglu:exp_fixed");  // the MLPs' arithmetic (kernels.h's swiglu): KV stored before it is another's
  if (config.moe.any()) add(st, "moe-route:exp_fixed");  // the routing's softmax (expert_parallel.h), likewise
  return hex(XXH3_64bits_digest(st));
}

}  // namespace tandem::runtime
