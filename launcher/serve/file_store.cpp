#include "launcher/serve/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "common/error.h"

namespace tandem::launcher {
namespace fs = std::filesystem;
using json = nlohmann::json;

json file_object(const StoredFile& f) {
  return {{"id", f.id},           {"object", "file"},  {"bytes", f.bytes},          {"created_at", f.created_at},
          {"filename", f.filename}, {"purpose", f.purpose}, {"status", "processed"}, {"expires_at", nullptr},
          {"status_details", nullptr}};
}

std::string random_hex(std::size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}() ^
                                          static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = kHex[rng() % 16];
  return s;
}

void write_whole(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".part";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  const bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
                  ::fsync(fileno(f)) == 0;
  if (f) std::fclose(f);
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    throw Error("cannot write " + path.string() + " (disk full, or no permission); free space in http.batch_dir");
  }
}

bool FileStore::valid_id(const std::string& id) {
  if (id.size() != 5 + 24 || id.rfind("file-", 0) != 0) return false;
  return std::all_of(id.begin() + 5, id.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

FileStore::FileStore(const fs::path& batch_dir) : dir_(batch_dir / "files") {
  std::error_code ec;
  if (!fs::exists(dir_, ec)) return;  // made by the first upload: a serve that takes no files writes nothing
  if (!fs::is_directory(dir_, ec))
    throw Error(dir_.string() + " is not a folder; set http.batch_dir to a folder this job may write");
  // A killed server's leftovers. Another server may share the folder: an
  // upload it is writing holds a lock on its file, and a record it is about to
  // write follows its bytes within moments, so only what no one locks, or what
  // is a minute old, goes.
  const auto stale = [](const fs::path& p) {
    std::error_code err;
    const auto t = fs::last_write_time(p, err);
    return !err && fs::file_time_type::clock::now() - t > std::chrono::minutes(1);
  };
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const fs::path p = e.path();
    const std::string name = p.filename().string();
    if (name.rfind(".upload-", 0) == 0) {
      const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0) fs::remove(p, ec);  // no upload holds it
      if (fd >= 0) ::close(fd);
    } else if (p.extension() == ".part" && stale(p)) {
      fs::remove(p, ec);
    } else if (valid_id(name) && !fs::exists(dir_ / (name + ".json")) && stale(p)) {  // bytes whose record never landed
      fs::remove(p, ec);
    }
  }
}

std::unique_ptr<FileStore::Upload> FileStore::begin(int64_t max_bytes) {
  std::error_code ec;
  fs::create_directories(dir_, ec);  // a failure shows as the upload's io_error
  return std::unique_ptr<Upload>(new Upload(*this, dir_ / (".upload-" + random_hex(16)), max_bytes));
}

FileStore::Upload::Upload(FileStore& store, fs::path tmp, int64_t max_bytes)
    : store_(store), tmp_(std::move(tmp)), max_bytes_(max_bytes) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (f_) (void)::flock(fileno(f_), LOCK_EX);  // a server starting on the same folder leaves it alone (FileStore())
  if (!f_) io_error_ = "cannot create " + tmp_.string() + "; set http.batch_dir to a folder this job may write";
}

FileStore::Upload::~Upload() {
  if (f_) std::fclose(f_);
  if (!committed_) {
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
}

bool FileStore::Upload::write(const char* data, std::size_t n) {
  if (!f_ || too_large_) return false;
  if (bytes_ + static_cast<int64_t>(n) > max_bytes_) {
    too_large_ = true;
    return false;
  }
  if (std::fwrite(data, 1, n, f_) != n) {
    io_error_ = "cannot write " + tmp_.string() + " (disk full?)";
    return false;
  }
  bytes_ += static_cast<int64_t>(n);
  return true;
}

StoredFile FileStore::Upload::commit(const std::string& filename, const std::string& purpose) {
  if (!f_ || std::fflush(f_) != 0 || ::fsync(fileno(f_)) != 0)
    throw Error("cannot write " + tmp_.string() + " (disk full, or no permission)");
  std::fclose(f_);
  f_ = nullptr;
  StoredFile sf;
  sf.bytes = bytes_;
  sf.created_at = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  sf.filename = filename;
  sf.purpose = purpose;
  std::lock_guard lock(store_.mu_);
  do sf.id = "file-" + random_hex(24);
  while (fs::exists(store_.dir_ / sf.id));
  fs::rename(tmp_, store_.dir_ / sf.id);
  committed_ = true;
  json record = file_object(sf);
  write_whole(store_.dir_ / (sf.id + ".json"), record.dump() + "\n");
  return sf;
}

StoredFile FileStore::adopt(const fs::path& src, const std::string& id, const std::string& filename,
                            const std::string& purpose) {
  StoredFile sf;
  sf.id = id;
  sf.bytes = static_cast<int64_t>(fs::file_size(src));
  sf.created_at = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  sf.filename = filename;
  sf.purpose = purpose;
  std::lock_guard lock(mu_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  fs::rename(src, dir_ / id, ec);
  if (ec) throw Error("cannot move " + src.string() + " into " + dir_.string() + ": " + ec.message());
  write_whole(dir_ / (id + ".json"), file_object(sf).dump() + "\n");
  return sf;
}

std::optional<StoredFile> FileStore::get(const std::string& id) const {
  if (!valid_id(id)) return std::nullopt;
  std::lock_guard lock(mu_);
  std::ifstream in(dir_ / (id + ".json"));
  if (!in) return std::nullopt;
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  StoredFile f;
  f.id = id;
  f.bytes = j.value("bytes", int64_t{0});
  f.created_at = j.value("created_at", int64_t{0});
  f.filename = j.value("filename", std::string());
  f.purpose = j.value("purpose", std::string());
  return f;
}

std::vector<StoredFile> FileStore::list() const {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mu_);
    std::error_code ec;
    if (!fs::is_directory(dir_, ec)) return {};
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().extension() == ".json" && valid_id(e.path().stem().string())) ids.push_back(e.path().stem().string());
    }
  }
  std::vector<StoredFile> files;
  for (const auto& id : ids)
    if (auto f = get(id)) files.push_back(std::move(*f));
  std::sort(files.begin(), files.end(), [](const StoredFile& a, const StoredFile& b) {
    return a.created_at != b.created_at ? a.created_at > b.created_at : a.id > b.id;
  });
  return files;
}

bool FileStore::remove(const std::string& id) {
  if (!valid_id(id)) return false;
  std::lock_guard lock(mu_);
  std::error_code ec;
  const bool had = fs::remove(dir_ / (id + ".json"), ec);  // the record first: without it the file is gone
  fs::remove(dir_ / id, ec);
  return had;
}

}  // namespace tandem::launcher
