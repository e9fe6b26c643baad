#include "runtime/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tandem::runtime {

class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path) : path_(path.string()) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error(path_ + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw Error(path_ + ": cannot stat (" + std::strerror(errno) + ")");
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      data_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (data_ == MAP_FAILED) {
        data_ = nullptr;
        throw Error(path_ + ": cannot memory-map (" + std::strerror(errno) + ")");
      }
    }
  }
  ~MappedFile() {
    if (data_) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Checkpoint::~Checkpoint() = default;

std::unique_ptr<Checkpoint> Checkpoint::open(const std::filesystem::path& model_dir) {
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  const auto single = model_dir / "model.safetensors";
  const auto index = model_dir / "model.safetensors.index.json";
  if (std::filesystem::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(index.string() + ": not valid JSON at byte " + std::to_string(e.byte));
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string() + ": no \"weight_map\" object");
    std::set<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) shards.insert(it.value().get<std::string>());
    for (const auto& s : shards) {
      if (!std::filesystem::exists(model_dir / s))
        throw Error(index.string() + ": names shard '" + s + "', which is missing from " + model_dir.string());
      c->add_file(model_dir / s);
    }
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      auto t = c->tensors_.find(it.key());
      if (t == c->tensors_.end() || std::filesystem::path(t->second.file).filename() != it.value().get<std::string>())
        throw Error(index.string() + ": tensor '" + it.key() + "' is not in shard '" + it.value().get<std::string>() + "'");
    }
  } else if (std::filesystem::exists(single)) {
    c->add_file(single);
  } else {
    throw Error(model_dir.string() +
                ": no model.safetensors or model.safetensors.index.json (Tandem reads safetensors checkpoints)");
  }
  return c;
}

void Checkpoint::add_file(const std::filesystem::path& path) {
  auto file = std::make_unique<MappedFile>(path);
  const std::string& where = file->path();
  if (file->size() < 8) throw Error(where + ": too short to be a safetensors file (truncated?)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file->data()[i];
  if (n > file->size() - 8) throw Error(where + ": header length " + std::to_string(n) + " runs past the end of the file (truncated?)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file->data() + 8, file->data() + 8 + n);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(where + ": header is not valid JSON at byte " + std::to_string(e.byte));
  }
  if (!header.is_object()) throw Error(where + ": header is not a JSON object");
  const uint8_t* base = file->data() + 8 + n;
  const std::size_t data_size = file->size() - 8 - n;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    TensorView t;
    t.name = it.key();
    t.file = where;
    std::vector<uint64_t> off;
    try {
      const auto& h = it.value();
      const std::string dt = h.at("dtype").get<std::string>();
      if (!parse_dtype(dt, t.dtype))
        throw Error(where + ": tensor '" + t.name + "' has dtype " + dt + " (supported: F32, BF16, F16)");
      t.shape = h.at("shape").get<std::vector<int64_t>>();
      off = h.at("data_offsets").get<std::vector<uint64_t>>();
    } catch (const nlohmann::json::exception&) {
      throw Error(where + ": tensor '" + t.name + "' has no dtype, shape and data_offsets of the right types in the "
                  "header (a damaged or hand-edited file? re-download or re-save it)");
    }
    uint64_t numel = 1;
    for (const int64_t d : t.shape) {
      if (d < 0 || (d > 0 && numel > UINT64_MAX / static_cast<uint64_t>(d) / 8))
        throw Error(where + ": tensor '" + t.name + "' has an impossible shape " + t.shape_string());
      numel *= static_cast<uint64_t>(d);
    }
    if (off.size() != 2 || off[1] < off[0]) throw Error(where + ": tensor '" + t.name + "' has bad data_offsets");
    if (off[1] > data_size) {
      throw Error(where + ": tensor '" + t.name + "' needs bytes up to " + std::to_string(off[1]) + " but the file has " +
                  std::to_string(data_size) + " after its header (truncated shard? re-download it)");
    }
    if (off[1] - off[0] != numel * dtype_size(t.dtype))
      throw Error(where + ": tensor '" + t.name + "' size does not match its shape " + t.shape_string());
    t.data = base + off[0];
    if (tensors_.count(t.name)) throw Error(where + ": tensor '" + t.name + "' appears in two shards");
    spans.push_back({off[0], off[1], t.name});
    tensors_.emplace(t.name, std::move(t));
  }
  // The format's rule: the tensors' bytes cover the data exactly, without
  // overlaps or holes (no byte read as two tensors, none belonging to none).
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const Span* last = nullptr;
  auto fix = [] { return "; the file breaks the safetensors format (re-download it, or re-save it with safetensors)"; };
  for (const Span& sp : spans) {
    if (sp.begin < at)
      throw Error(where + ": tensors '" + last->name + "' (bytes " + std::to_string(last->begin) + "-" +
                  std::to_string(last->end) + ") and '" + sp.name + "' (bytes " + std::to_string(sp.begin) + "-" +
                  std::to_string(sp.end) + ") overlap" + fix());
    if (sp.begin > at)
      throw Error(where + ": bytes " + std::to_string(at) + "-" + std::to_string(sp.begin) +
                  " after the header belong to no tensor (before '" + sp.name + "')" + fix());
    at = sp.end;
    last = &sp;
  }
  if (at != data_size)
    throw Error(where + ": the " + std::to_string(data_size - at) + " byte(s) after " +
                (last ? "'" + last->name + "'" : std::string("the header")) + " belong to no tensor" + fix());
  files_.push_back(std::move(file));
}

void Checkpoint::release(const void* p, std::size_t n) const {
  const auto* b = static_cast<const uint8_t*>(p);
  for (const auto& f : files_) {
    if (b < f->data() || b + n > f->data() + f->size()) continue;
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const std::uintptr_t lo = (reinterpret_cast<std::uintptr_t>(b) + page - 1) / page * page;
    const std::uintptr_t hi = (reinterpret_cast<std::uintptr_t>(b) + n) / page * page;
    if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    return;
  }
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path, const std::vector<TensorSpec>& tensors)
    : path_(path.string()), out_(path, std::ios::binary | std::ios::trunc) {
  if (!out_) throw Error(path_ + ": cannot write");
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t bytes = dtype_size(t.dtype);
    for (const int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    header[t.name] = {{"dtype", safetensors_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  expected_ = offset;
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h += ' ';  // align data to 8 bytes, as the reference writer does
  uint8_t len[8];
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out_.write(reinterpret_cast<const char*>(len), 8);
  out_.write(h.data(), static_cast<std::streamsize>(h.size()));
}

void SafetensorsWriter::write(const void* bytes, std::size_t n) {
  out_.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
  written_ += n;
  if (!out_) throw Error(path_ + ": write failed (disk full?)");
}

void SafetensorsWriter::finish() {
  if (written_ != expected_)
    throw Error(path_ + ": internal: " + std::to_string(written_) + " data bytes written of " + std::to_string(expected_));
  out_.close();
  if (!out_) throw Error(path_ + ": write failed (disk full?)");
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorData>& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  SafetensorsWriter w(path, specs);
  for (const auto& t : tensors) w.write(t.bytes.data(), t.bytes.size());
  w.finish();
}

}  // namespace tandem::runtime
