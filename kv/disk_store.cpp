#include "kv/disk_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>

namespace tandem::kv {
namespace {

// Chunks are read and written raw: the file says float32 little-endian, so must memory.
static_assert(std::endian::native == std::endian::little, "the KV store's raw chunk I/O assumes little-endian floats");

using Dims6 = std::array<hsize_t, 6>;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The "dtype" attribute of a store of this layout's elements.
// FP8 rows are head_dim E4M3 codes then their float32 scale, as the pool holds them.
std::string store_dtype(const KvLayout& l) {
  return l.fp8() ? "float8_e4m3fn+scale" : l.elem_bytes == 2 ? "bfloat16" : "float32";
}
// The kv.dtype setting that reads a store of this "dtype" attribute.
std::string kv_dtype_setting(const std::string& store) {
  return store == "bfloat16" ? "bf16" : store == "float8_e4m3fn+scale" ? "fp8" : "f32";
}
// bf16 files are layout version 2: a Tandem that knows only float32 stores calls them another layout.
// A row's checksum covers its key as well as its data: a row whose /hash
// entry was changed (rows swapped, hashes shifted) fails it, so KV is never
// served for another prefix.
uint64_t row_checksum(uint64_t block_hash, const void* block, const KvLayout& l) {
  return XXH3_64bits_withSeed(block, l.block_bytes(), block_hash);
}

int64_t store_version(const KvLayout& l) {
  return l.fp8() ? kStoreLayoutVersion + 2 : l.elem_bytes == 2 ? kStoreLayoutVersion + 1 : kStoreLayoutVersion;
}

Dims6 block_dims(const KvLayout& l, hsize_t rows) {
  return {rows, static_cast<hsize_t>(l.layers), 2, static_cast<hsize_t>(l.kv_heads),
          static_cast<hsize_t>(l.block_size), static_cast<hsize_t>(l.row_elems())};
}

H5Id file_access() {
  // Each file has one writer and is read only once finished, so HDF5's file
  // locks add nothing, and they fail on parallel filesystems mounted without
  // flock (the usual HDF5_USE_FILE_LOCKING=FALSE advice, built in).
  H5Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_file_locking(fapl.get(), 0, 1);
  return fapl;
}

bool write_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5Id type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  H5Id space(H5Screate(H5S_SCALAR));
  H5Id attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  const char* p = value.c_str();
  return attr.valid() && H5Awrite(attr.get(), type.get(), &p) >= 0;
}

bool write_int_attr(hid_t obj, const char* name, int64_t value) {
  H5Id attr;
  if (H5Aexists(obj, name) > 0) {
    attr = H5Id(H5Aopen(obj, name, H5P_DEFAULT));
  } else {
    H5Id space(H5Screate(H5S_SCALAR));
    attr = H5Id(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  }
  return attr.valid() && H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) >= 0;
}

// A string attribute, variable- or fixed-length; nullopt when missing or not a string.
std::optional<std::string> read_string_attr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return std::nullopt;
  H5Id attr(H5Aopen(obj, name, H5P_DEFAULT));
  H5Id type(H5Aget_type(attr.get()));
  if (H5Tget_class(type.get()) != H5T_STRING) return std::nullopt;
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Id mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* p = nullptr;
    if (H5Aread(attr.get(), mem.get(), &p) < 0 || !p) return std::nullopt;
    std::string s(p);
    H5free_memory(p);
    return s;
  }
  std::string s(H5Tget_size(type.get()), '\0');
  if (H5Aread(attr.get(), type.get(), s.data()) < 0) return std::nullopt;
  s.resize(std::strlen(s.c_str()));
  return s;
}

std::optional<int64_t> read_int_attr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return std::nullopt;
  H5Id attr(H5Aopen(obj, name, H5P_DEFAULT));
  int64_t v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0) return std::nullopt;
  return v;
}

// Rows [0, n) of a one-dimensional uint64 dataset.
bool read_u64(hid_t file, const char* name, int64_t n, std::vector<uint64_t>& out) {
  H5Id set(H5Dopen2(file, name, H5P_DEFAULT));
  if (!set.valid()) return false;
  H5Id space(H5Dget_space(set.get()));
  hsize_t len = 0;
  if (H5Sget_simple_extent_ndims(space.get()) != 1) return false;
  H5Sget_simple_extent_dims(space.get(), &len, nullptr);
  if (static_cast<int64_t>(len) < n) return false;
  out.resize(static_cast<std::size_t>(n));
  if (n == 0) return true;
  const hsize_t start = 0, count = static_cast<hsize_t>(n);
  H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr);
  H5Id mem(H5Screate_simple(1, &count, nullptr));
  return H5Dread(set.get(), H5T_NATIVE_UINT64, mem.get(), space.get(), H5P_DEFAULT, out.data()) >= 0;
}

// Appends values at rows [at, at + n) of a one-dimensional uint64 dataset, extending it.
bool append_u64(hid_t set, hsize_t at, std::span<const uint64_t> values) {
  const hsize_t size = at + values.size(), count = values.size();
  if (H5Dset_extent(set, &size) < 0) return false;
  H5Id space(H5Dget_space(set));
  H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &at, nullptr, &count, nullptr);
  H5Id mem(H5Screate_simple(1, &count, nullptr));
  return H5Dwrite(set, H5T_NATIVE_UINT64, mem.get(), space.get(), H5P_DEFAULT, values.data()) >= 0;
}

H5Id create_u64(hid_t file, const char* name) {
  const hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk = 4096;
  H5Id space(H5Screate_simple(1, &zero, &unlimited));
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_chunk(dcpl.get(), 1, &chunk);
  return H5Id(H5Dcreate2(file, name, H5T_STD_U64LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
}

std::string file_stamp() {
  char when[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(when, sizeof when, "%Y%m%dT%H%M%S", &tm);
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  return std::string(when) + "-" + host + "-" + std::to_string(getpid());
}

}  // namespace

std::string DiskStore::describe() const { return "kv store " + o_.dir.string(); }

DiskStore::DiskStore(Options options, std::vector<std::string>& warnings) : o_(std::move(options)) {
  h5_quiet();
  if (o_.dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(o_.dir, ec);
  if (!std::filesystem::is_directory(o_.dir)) {
    warnings.push_back(describe() + ": cannot use it as a directory (" +
                       (ec ? ec.message() : std::string("it is a file")) +
                       "): this job runs without the store; fix kv.store_path");
    return;
  }
  std::vector<std::filesystem::path> names;
  for (const auto& e : std::filesystem::directory_iterator(o_.dir, ec))
    if (e.path().extension() == ".h5") names.push_back(e.path());
  std::sort(names.begin(), names.end());  // oldest first: the index keeps a hash's first copy
  bool foreign = false;
  for (const auto& p : names) {
    index_file(p, warnings, foreign);
    if (foreign) {
      files_.clear();
      where_.clear();
      files_read_ = 0;
      return;  // enabled_ stays false: another model's store is neither read nor added to
    }
  }
  enabled_ = true;
  // Write permission, tried for real (root passes every access() check).
  const auto probe = o_.dir / (".tandem-probe-" + std::to_string(getpid()));
  {
    std::ofstream f(probe);
    writable_ = static_cast<bool>(f);
  }
  if (!writable_) {
    warnings.push_back(describe() + ": cannot write there (" + std::strerror(errno) +
                       "): this job reads the store but adds nothing to it; make it writable or point "
                       "kv.store_path elsewhere");
  }
  std::filesystem::remove(probe, ec);
}

DiskStore::~DiskStore() { close(); }

void DiskStore::index_file(const std::filesystem::path& path, std::vector<std::string>& warnings, bool& foreign) {
  const std::string name = path.filename().string();
  auto skip = [&](const std::string& why) {
    warnings.push_back(describe() + ": " + name + " " + why + "; it is skipped (delete it to silence this)");
  };
  H5Id fapl = file_access();
  File f;
  f.path = path;
  f.file = H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!f.file.valid()) return skip("cannot be read (" + h5_error() + ")");
  const hid_t h = f.file.get();
  const auto format = read_string_attr(h, "format");
  const auto fingerprint = read_string_attr(h, "model_fingerprint");
  const auto model = read_string_attr(h, "model");
  const auto version = read_int_attr(h, "layout_version"), rows = read_int_attr(h, "blocks");
  const auto bs = read_int_attr(h, "block_size"), layers = read_int_attr(h, "layers"),
             kvh = read_int_attr(h, "kv_heads"), hd = read_int_attr(h, "head_dim");
  if (format != "tandem-kv-store" || !fingerprint || !version || !rows || !bs || !layers || !kvh || !hd)
    return skip("is not a Tandem KV store file (attributes missing)");
  const KvLayout& l = o_.id.layout;
  const std::string dtype = read_string_attr(h, "dtype").value_or("float32");
  if (*fingerprint != o_.id.fingerprint || *version != store_version(l) || *bs != l.block_size ||
      *layers != l.layers || *kvh != l.kv_heads || *hd != l.head_dim || dtype != store_dtype(l)) {
    foreign = true;
    warnings.push_back(describe() + " holds KV of another model or layout (" + name + ": " + model.value_or("?") +
                       ", fingerprint " + *fingerprint + ", block_size " + std::to_string(*bs) + ", " + dtype +
                       "; this job: " + o_.id.model + ", fingerprint " + o_.id.fingerprint + ", block_size " +
                       std::to_string(l.block_size) + ", " + store_dtype(l) + "): it is not used; " +
                       (*version < kStoreLayoutVersion
                            ? "it was written by an older Tandem (layout version " + std::to_string(*version) +
                                  "); point kv.store_path elsewhere, or remove its files"
                        : *fingerprint == o_.id.fingerprint && *bs == l.block_size && dtype != store_dtype(l)
                            ? "set kv.dtype = \"" + kv_dtype_setting(dtype) +
                                  "\" to use it, or point kv.store_path elsewhere"
                        : model == o_.id.model && *fingerprint != o_.id.fingerprint
                            ? "the same model's name with another fingerprint: other weights, model.dtype or "
                              "model.cpu_matmul, or KV from an older Tandem (on 2026-12-07 the SwiGLU's exp, and "
                              "a mixture of experts' routing's, changed the bits); point kv.store_path elsewhere"
                            : std::string("point kv.store_path elsewhere")));
    return;
  }
  f.kv = H5Id(H5Dopen2(h, "kv", H5P_DEFAULT));
  if (!f.kv.valid()) return skip("is damaged (" + h5_error() + ")");
  {
    H5Id space(H5Dget_space(f.kv.get()));
    Dims6 dims{};
    if (H5Sget_simple_extent_ndims(space.get()) != 6) return skip("is damaged (/kv is not 6-dimensional)");
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    H5Id type(H5Dget_type(f.kv.get()));
    if (static_cast<int64_t>(H5Tget_size(type.get())) != l.elem_bytes)  // raw chunks are read into block_bytes
      return skip("is damaged (/kv's elements are not " + store_dtype(l) + ")");
    Dims6 want = block_dims(l, dims[0]);
    if (dims != want || static_cast<int64_t>(dims[0]) < *rows) return skip("is damaged (/kv has the wrong shape)");
    // Blocks are read as raw chunks: one block per chunk, unfiltered.
    H5Id dcpl(H5Dget_create_plist(f.kv.get()));
    Dims6 chunk{};
    if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED || H5Pget_chunk(dcpl.get(), 6, chunk.data()) != 6 ||
        chunk != block_dims(l, 1) || H5Pget_nfilters(dcpl.get()) != 0)
      return skip("is not laid out as one unfiltered chunk per block");
  }
  std::vector<uint64_t> hashes;
  if (!read_u64(h, "hash", *rows, hashes) || !read_u64(h, "checksum", *rows, f.checksums))
    return skip("is damaged (/hash or /checksum unreadable: " + h5_error() + ")");
  const std::size_t index = files_.size();
  for (int64_t r = 0; r < *rows; ++r) where_.emplace(hashes[static_cast<std::size_t>(r)], std::make_pair(index, r));
  std::error_code ec;
  bytes_ += static_cast<int64_t>(std::filesystem::file_size(path, ec));
  files_.push_back(std::move(f));
  ++files_read_;
}

std::vector<uint64_t> DiskStore::hashes() const {
  std::vector<uint64_t> out;
  out.reserve(where_.size());
  for (const auto& [h, at] : where_) out.push_back(h);
  return out;
}

bool DiskStore::read(uint64_t hash, float* dst, std::string& warning) {
  auto it = where_.find(hash);
  if (it == where_.end()) return false;
  const auto [fi, row] = it->second;
  File& f = files_[fi];
  const KvLayout& l = o_.id.layout;
  // One block is one chunk, stored raw: read its bytes directly (no selection, no conversion).
  const Dims6 start{static_cast<hsize_t>(row), 0, 0, 0, 0, 0};
  uint32_t filters = 0;
  std::string problem;
  if (H5Dread_chunk(f.kv.get(), H5P_DEFAULT, start.data(), &filters, dst) < 0 || filters != 0)
    problem = "cannot be read (" + h5_error() + ")";
  else if (row_checksum(hash, dst, l) != f.checksums[static_cast<std::size_t>(row)])
    problem = "has a block that fails its checksum (its data or its block hash was changed: the file is damaged)";
  if (problem.empty()) {
    if (!f.writing && !f.touched) {  // used: the last to be pruned (LRU by modification time, per file)
      ::utimensat(AT_FDCWD, f.path.c_str(), nullptr, 0);
      f.touched = true;
    }
    return true;
  }
  if (warning.empty())
    warning = describe() + ": " + f.path.filename().string() + " " + problem +
              "; its blocks are recomputed from now on (delete it to silence this)";
  drop_file(fi);
  return false;
}

void DiskStore::drop_file(std::size_t fi) {
  std::erase_if(where_, [fi](const auto& e) { return e.second.first == fi; });
  if (static_cast<int64_t>(fi) == current_) writable_ = false;
}

// Makes room for `need` more bytes under max_bytes, down to 90% of it: deletes
// finished files, least recently used first (a file's modification time is
// its last write, or its last read by any job: read() touches it). A job
// still reading a deleted file keeps it open; later jobs do not see it.
void DiskStore::prune(int64_t need) {
  struct Candidate {
    std::filesystem::file_time_type used;
    std::filesystem::path path;
    int64_t bytes;
  };
  std::vector<Candidate> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(o_.dir, ec)) {
    if (e.path().extension() != ".h5") continue;
    files.push_back({e.last_write_time(ec), e.path(), static_cast<int64_t>(e.file_size(ec))});
  }
  std::sort(files.begin(), files.end(), [](const Candidate& a, const Candidate& b) { return a.used < b.used; });
  const int64_t target = o_.max_bytes - o_.max_bytes / 10;
  for (const Candidate& c : files) {
    if (bytes_ + need <= target) break;
    if (!std::filesystem::remove(c.path, ec) || ec) continue;
    bytes_ -= c.bytes;
    ++pruned_files_;
    pruned_bytes_ += c.bytes;
  }
}

bool DiskStore::start_file(std::string& warning) {
  static std::atomic<int> sequence{0};  // per process: two stores in one process never share a name
  const std::string base = "kv-" + file_stamp() + "-" + std::to_string(sequence++) + ".h5";
  File f;
  f.path = o_.dir / (base + ".part");
  f.writing = true;
  H5Id fapl = file_access();
  f.file = H5Id(H5Fcreate(f.path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()));
  const KvLayout& l = o_.id.layout;
  bool ok = f.file.valid();
  if (ok) {
    const hid_t h = f.file.get();
    ok = write_string_attr(h, "format", "tandem-kv-store") &&
         write_string_attr(h, "model_fingerprint", o_.id.fingerprint) && write_string_attr(h, "model", o_.id.model) &&
         write_string_attr(h, "dtype", store_dtype(l)) && write_int_attr(h, "layout_version", store_version(l)) &&
         write_int_attr(h, "block_size", l.block_size) && write_int_attr(h, "layers", l.layers) &&
         write_int_attr(h, "kv_heads", l.kv_heads) && write_int_attr(h, "head_dim", l.head_dim) &&
         write_int_attr(h, "blocks", 0);
    const Dims6 zero = block_dims(l, 0), chunk = block_dims(l, 1);
    Dims6 max = zero;
    max[0] = H5S_UNLIMITED;
    H5Id space(H5Screate_simple(6, zero.data(), max.data()));
    H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_chunk(dcpl.get(), 6, chunk.data());
    // bf16 and FP8 have no HDF5 type: their bits, as unsigned integers (the "dtype" attribute says so).
    f.kv = H5Id(H5Dcreate2(h, "kv", l.fp8() ? H5T_STD_U8LE : l.elem_bytes == 2 ? H5T_STD_U16LE : H5T_IEEE_F32LE,
                           space.get(), H5P_DEFAULT,
                           dcpl.get(), H5P_DEFAULT));
    hash_set_ = create_u64(h, "hash");
    checksum_set_ = create_u64(h, "checksum");
    ok = ok && f.kv.valid() && hash_set_.valid() && checksum_set_.valid();
  }
  if (!ok) {
    warning = describe() + ": cannot create " + f.path.filename().string() + " (" + h5_error() +
              "): nothing more is stored in this job";
    writable_ = false;
    hash_set_.reset();
    checksum_set_.reset();
    f.kv.reset();
    f.file.reset();
    std::error_code ec;
    std::filesystem::remove(f.path, ec);
    return false;
  }
  current_ = static_cast<int64_t>(files_.size());
  files_.push_back(std::move(f));
  rows_ = 0;
  started_ = now_s();
  return true;
}

bool DiskStore::write(std::span<const uint64_t> hashes, const float* data, std::string& warning) {
  if (!writable() || hashes.empty()) return false;
  const KvLayout& l = o_.id.layout;
  const auto n = static_cast<int64_t>(hashes.size());
  const int64_t bytes = n * static_cast<int64_t>(l.block_bytes());
  if (o_.max_bytes > 0 && bytes_ + bytes > o_.max_bytes) prune(bytes);
  if (o_.max_bytes > 0 && bytes_ + bytes > o_.max_bytes) {
    warning = describe() + ": reached its size limit (" + std::to_string(o_.max_bytes >> 20) +
              " MiB) with nothing left to remove but this job's own file: nothing more is stored in this job; "
              "raise kv.store_max_gib";
    writable_ = false;
    return false;
  }
  if (current_ < 0 && !start_file(warning)) return false;
  File& f = files_[static_cast<std::size_t>(current_)];
  std::vector<uint64_t> sums(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    sums[static_cast<std::size_t>(i)] = row_checksum(hashes[static_cast<std::size_t>(i)], data + i * l.block_floats(), l);
  const Dims6 size = block_dims(l, static_cast<hsize_t>(rows_ + n));
  bool ok = H5Dset_extent(f.kv.get(), size.data()) >= 0;
  for (int64_t i = 0; ok && i < n; ++i) {  // one block is one chunk: written raw, as the pool holds it
    const Dims6 at{static_cast<hsize_t>(rows_ + i), 0, 0, 0, 0, 0};
    ok = H5Dwrite_chunk(f.kv.get(), H5P_DEFAULT, 0, at.data(), l.block_bytes(), data + i * l.block_floats()) >= 0;
  }
  // Rows count once their data, hashes and checksums are all written (the "blocks" attribute).
  ok = ok && append_u64(hash_set_.get(), static_cast<hsize_t>(rows_), hashes) &&
       append_u64(checksum_set_.get(), static_cast<hsize_t>(rows_), sums) &&
       write_int_attr(f.file.get(), "blocks", rows_ + n);
  if (!ok) {
    warning = describe() + ": writing " + f.path.filename().string() + " failed (" + h5_error() +
              "): nothing more is stored in this job";
    writable_ = false;
    finish_file();
    return false;
  }
  for (int64_t i = 0; i < n; ++i) {
    where_.emplace(hashes[static_cast<std::size_t>(i)], std::make_pair(static_cast<std::size_t>(current_), rows_ + i));
    f.checksums.push_back(sums[static_cast<std::size_t>(i)]);
  }
  rows_ += n;
  bytes_ += bytes;
  if (now_s() - started_ >= o_.roll_seconds) finish_file();
  return true;
}

// Closes the file being written, renames it to .h5 for later jobs, and
// reopens it read-only so this process can still read its blocks.
void DiskStore::finish_file() {
  if (current_ < 0) return;
  File& f = files_[static_cast<std::size_t>(current_)];
  current_ = -1;
  hash_set_.reset();
  checksum_set_.reset();
  f.kv.reset();
  f.file.reset();
  auto done = f.path;
  done.replace_extension();  // drop ".part"
  std::error_code ec;
  std::filesystem::rename(f.path, done, ec);
  if (ec) return;  // its blocks stay indexed but unreadable: reads fail and fall back to recomputing
  f.path = done;
  f.writing = false;
  H5Id fapl = file_access();
  f.file = H5Id(H5Fopen(done.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (f.file.valid()) f.kv = H5Id(H5Dopen2(f.file.get(), "kv", H5P_DEFAULT));
}

void DiskStore::close() { finish_file(); }

}  // namespace tandem::kv
