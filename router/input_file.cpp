#include "router/input_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace tandem::router {

// Decoded bytes of the input. read() returns 0 at the end and throws
// tandem::Error (one line) on a read error or bad compressed data.
class InputFile::Source {
 public:
  virtual ~Source() = default;
  virtual std::size_t read(char* buf, std::size_t cap) = 0;
  // Whether the data carries checksums that reading it through verifies.
  virtual bool checksummed() const { return false; }
};

namespace {

constexpr std::size_t kChunk = 1 << 20;

std::string bytes_read(uint64_t n) { return "after " + std::to_string(n) + " bytes of decoded input"; }

std::size_t read_fd(int fd, char* buf, std::size_t cap, const std::string& path) {
  while (true) {
    const ssize_t n = ::read(fd, buf, cap);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR) throw Error(path + ": cannot read the input (" + std::strerror(errno) + ")");
  }
}

class PlainSource : public InputFile::Source {
 public:
  PlainSource(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PlainSource() override { ::close(fd_); }
  std::size_t read(char* buf, std::size_t cap) override { return read_fd(fd_, buf, cap, path_); }

 private:
  int fd_;
  std::string path_;
};

// gzip through zlib's inflate, member after member (concatenated .gz files
// are one input; zero bytes after the last member, as tar pads, are
// allowed). Each member ends with the CRC-32 of its data, which inflate
// checks: damage is found there at the latest, which is why the job reads
// compressed input through once before any work (router/input_scan.h).
class GzipSource : public InputFile::Source {
 public:
  GzipSource(int fd, std::string path) : fd_(fd), path_(std::move(path)), in_(kChunk) {
    if (inflateInit2(&zs_, 15 + 16) != Z_OK) {  // 16: a gzip header and trailer, nothing else
      ::close(fd_);
      throw Error(path_ + ": cannot open the gzip stream (out of memory)");
    }
  }
  ~GzipSource() override {
    inflateEnd(&zs_);
    ::close(fd_);
  }
  bool checksummed() const override { return true; }
  std::size_t read(char* buf, std::size_t cap) override {
    cap = std::min<std::size_t>(cap, 1u << 30);
    zs_.next_out = reinterpret_cast<Bytef*>(buf);
    zs_.avail_out = static_cast<uInt>(cap);
    while (zs_.avail_out == cap) {
      if (zs_.avail_in == 0 && !input_end_) {
        const std::size_t n = read_fd(fd_, in_.data(), in_.size(), path_);
        zs_.next_in = reinterpret_cast<Bytef*>(in_.data());
        zs_.avail_in = static_cast<uInt>(n);
        read_ += n;
        input_end_ = n == 0;
      }
      if (between_members_) {  // another member, zero padding, or the end
        if (zs_.avail_in == 0) return 0;
        while (zs_.avail_in > 0 && *zs_.next_in == 0) ++zs_.next_in, --zs_.avail_in, padded_ = true;
        if (zs_.avail_in == 0) continue;
        if (padded_) fail("corrupt", "data after the zero bytes that follow its last member");
        if (inflateReset(&zs_) != Z_OK) fail("corrupt", "cannot start its next member");
        between_members_ = false;
      }
      if (zs_.avail_in == 0 && input_end_) fail("truncated", "it ends inside a member", cap - zs_.avail_out);
      const int ret = inflate(&zs_, Z_NO_FLUSH);
      if (ret == Z_STREAM_END) between_members_ = true;
      else if (ret != Z_OK && ret != Z_BUF_ERROR)
        fail("corrupt", std::string("zlib: ") + (zs_.msg ? zs_.msg : "error " + std::to_string(ret)), cap - zs_.avail_out);
    }
    const std::size_t got = cap - zs_.avail_out;
    decoded_ += got;
    return got;
  }

 private:
  [[noreturn]] void fail(const char* what, const std::string& why, std::size_t decoded_now = 0) const {
    const uint64_t at = read_ - zs_.avail_in;
    throw Error(path_ + ": the gzip data is " + what + " at byte " + std::to_string(at) + " of the file, " +
                bytes_read(decoded_ + decoded_now) + " (" + why + "); check it with gzip -t, and restore or recompress it");
  }

  int fd_;
  std::string path_;
  std::vector<char> in_;
  z_stream zs_{};
  uint64_t read_ = 0, decoded_ = 0;
  bool input_end_ = false, between_members_ = false, padded_ = false;
};

class ZstdSource : public InputFile::Source {
 public:
  ZstdSource(int fd, std::string path) : fd_(fd), path_(std::move(path)), in_(ZSTD_DStreamInSize()) {
    ds_ = ZSTD_createDStream();
    if (!ds_) {
      ::close(fd_);
      throw Error(path_ + ": cannot open the zstd stream (out of memory)");
    }
  }
  ~ZstdSource() override {
    ZSTD_freeDStream(ds_);
    ::close(fd_);
  }
  // From the first frame's header: zstd writes a checksum unless told not to (zstd --no-check).
  bool checksummed() const override { return checksummed_; }
  std::size_t read(char* buf, std::size_t cap) override {
    ZSTD_outBuffer out{buf, cap, 0};
    while (out.pos == 0) {
      if (in_pos_ == in_len_ && !input_end_) {
        in_len_ = read_fd(fd_, in_.data(), in_.size(), path_);
        read_ += in_len_;
        in_pos_ = 0;
        input_end_ = in_len_ == 0;
        // The first frame's descriptor (the byte after the 4-byte magic): bit 2 is Content_Checksum_flag (RFC 8878).
        if (read_ == in_len_) checksummed_ = in_len_ > 4 && (static_cast<unsigned char>(in_[4]) & 0x04) != 0;
      }
      if (input_end_ && !frame_open_) return 0;
      // At the input's end, the decoder may still hold output of the last frame: flush it.
      ZSTD_inBuffer in{in_.data(), in_len_, in_pos_};
      const std::size_t ret = ZSTD_decompressStream(ds_, &out, &in);
      in_pos_ = in.pos;
      if (ZSTD_isError(ret))
        fail("corrupt", std::string("zstd: ") + ZSTD_getErrorName(ret), out.pos);
      frame_open_ = ret != 0;  // 0: a frame ended here, every byte of it given out
      if (input_end_ && frame_open_ && out.pos == 0)
        fail("truncated", "it ends inside a frame", out.pos);
    }
    decoded_ += out.pos;
    return out.pos;
  }

 private:
  [[noreturn]] void fail(const char* what, const std::string& why, std::size_t decoded_now) const {
    const uint64_t at = read_ - (in_len_ - in_pos_);
    throw Error(path_ + ": the zstd data is " + what + " at byte " + std::to_string(at) + " of the file, " +
                bytes_read(decoded_ + decoded_now) + " (" + why + "); check it with zstd -t, and restore or recompress it");
  }

  int fd_;
  std::string path_;
  ZSTD_DStream* ds_ = nullptr;
  std::vector<char> in_;
  std::size_t in_pos_ = 0, in_len_ = 0;
  bool frame_open_ = false, input_end_ = false, checksummed_ = false;
  uint64_t read_ = 0, decoded_ = 0;
};

bool starts_with(std::string_view data, std::string_view magic) { return data.substr(0, magic.size()) == magic; }

// What `data` (a file's first bytes) looks like when it is not JSONL text,
// with how to make it readable; "" when it may be text.
std::string not_text(std::string_view data) {
  using namespace std::string_view_literals;
  struct Magic {
    std::string_view bytes, what, fix;
  };
  static const std::array<Magic, 12> kKnown{{
      {"BZh"sv, "bzip2-compressed", "decompress it (bunzip2), or compress it with gzip or zstd, which Tandem reads as it streams"},
      {"\xFD" "7zXZ\0"sv, "xz-compressed", "decompress it (unxz), or compress it with gzip or zstd, which Tandem reads as it streams"},
      {"\x04\x22\x4D\x18"sv, "lz4-compressed", "decompress it (lz4 -d), or compress it with gzip or zstd"},
      {"\x1F\x9D"sv, "compress(1)-compressed (.Z)", "decompress it (uncompress), or compress it with gzip or zstd"},
      {"PK\x03\x04"sv, "a zip archive", "extract the JSONL file from it (unzip)"},
      {"7z\xBC\xAF\x27\x1C"sv, "a 7-zip archive", "extract the JSONL file from it"},
      {"PAR1"sv, "a Parquet file", "convert it to JSONL first (one request per line)"},
      {"ARROW1"sv, "an Arrow file", "convert it to JSONL first (one request per line)"},
      {"\x89HDF\r\n"sv, "an HDF5 file", "convert it to JSONL first (one request per line)"},
      {"SQLite format 3\0"sv, "an SQLite database", "export the requests as JSONL first"},
      {"\x7F" "ELF"sv, "an executable (ELF)", "check job.input or --input"},
      {"%PDF-"sv, "a PDF document", "check job.input or --input"},
  }};
  for (const auto& m : kKnown)
    if (starts_with(data, m.bytes)) return "looks like " + std::string(m.what) + ", not JSONL text; " + std::string(m.fix);
  if (data.size() > 262 && data.substr(257, 5) == "ustar")
    return "looks like a tar archive, not JSONL text; extract the JSONL file from it (tar -xf)";
  if (starts_with(data, "\xFF\xFE"sv) || starts_with(data, "\xFE\xFF"sv))
    return "is UTF-16 text; Tandem reads UTF-8: convert it (iconv -f UTF-16 -t UTF-8)";
  if (const auto nul = data.find('\0'); nul != std::string_view::npos)
    return "holds binary data (a NUL byte at byte " + std::to_string(nul) +
           "), not JSONL text; check job.input or --input";
  return "";
}

}  // namespace

std::string_view InputFile::name(Format f) {
  switch (f) {
    case Format::kGzip: return "gzip";
    case Format::kZstd: return "zstd";
    default: return "plain";
  }
}

InputFile::InputFile(const std::string& path, int64_t max_line_bytes)
    : path_(path), max_line_bytes_(max_line_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot read the input (" + std::strerror(errno) + "); check job.input or --input");
  std::array<unsigned char, 4> head{};
  const ssize_t got = ::pread(fd, head.data(), head.size(), 0);
  if (got >= 2 && head[0] == 0x1F && head[1] == 0x8B) {
    format_ = Format::kGzip;
    source_ = std::make_unique<GzipSource>(fd, path);
  } else if (got >= 4 && head[0] == 0x28 && head[1] == 0xB5 && head[2] == 0x2F && head[3] == 0xFD) {
    format_ = Format::kZstd;
    source_ = std::make_unique<ZstdSource>(fd, path);
  } else {
    source_ = std::make_unique<PlainSource>(fd, path);
  }
  // What the (decoded) text looks like, before any work.
  fill();
  const std::string_view start(buf_.data(), std::min<std::size_t>(buf_.size(), 64 * 1024));
  if (const std::string why = not_text(start); !why.empty())
    throw Error(path + (format_ == Format::kPlain ? ": " : ": (" + std::string(name(format_)) + ") ") + why);
  if (starts_with(start, "\xEF\xBB\xBF")) pos_ = 3;  // a UTF-8 byte-order mark is not part of the first line
}

InputFile::~InputFile() = default;

bool InputFile::checksummed() const { return source_->checksummed(); }

bool InputFile::fill() {
  if (eof_) return false;
  buf_.resize(kChunk);
  std::size_t n = 0;
  try {
    n = source_->read(buf_.data(), buf_.size());
  } catch (...) {
    buf_.clear();
    pos_ = 0;
    throw;
  }
  buf_.resize(n);
  pos_ = 0;
  eof_ = n == 0;
  return n > 0;
}

InputFile::Got InputFile::next(std::string& line, uint64_t& length) {
  line.clear();
  length = 0;
  bool any = false, too_long = false;
  const auto limit = static_cast<uint64_t>(std::max<int64_t>(max_line_bytes_, 1));
  while (true) {
    if (pos_ == buf_.size() && !fill()) break;
    any = true;
    const char* start = buf_.data() + pos_;
    const std::size_t avail = buf_.size() - pos_;
    const auto* nl = static_cast<const char*>(std::memchr(start, '\n', avail));
    const std::size_t take = nl ? static_cast<std::size_t>(nl - start) : avail;
    if (!too_long && length + take > limit) {
      too_long = true;
      if (line.size() > kKeptPrefix) line.resize(kKeptPrefix);
      line.shrink_to_fit();  // what was gathered of the line is given back
    }
    const std::size_t keep = too_long ? std::min(take, kKeptPrefix - std::min(kKeptPrefix, line.size())) : take;
    line.append(start, keep);
    length += take;
    pos_ += take;
    if (nl) {
      ++pos_;
      return too_long ? Got::kTooLong : Got::kLine;
    }
  }
  if (!any) return Got::kEnd;
  return too_long ? Got::kTooLong : Got::kLine;  // the last line, without a newline
}

}  // namespace tandem::router
