// The job's input, read line by line as it streams: plain JSONL, or JSONL
// compressed with gzip or zstd (recognised by their first bytes, whatever
// the file is called), never held whole in memory.
//
// Lines are bounded: a line longer than max_line_bytes is not kept; its
// first kKeptPrefix bytes are (so the error record can carry its custom_id)
// and the rest is skipped up to the next newline. Memory stays flat
// whatever the input holds. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace tandem::router {

class InputFile {
 public:
  enum class Format { kPlain, kGzip, kZstd };
  enum class Got { kLine, kTooLong, kEnd };
  static constexpr std::size_t kKeptPrefix = 64 * 1024;

  // Opens `path` and looks at its first bytes. Throws tandem::Error (one
  // line naming the file, what it looks like and the fix) when it cannot be
  // read, or when it is not text: another compression (bzip2, xz, zip, …),
  // an archive, a binary format (Parquet, HDF5, …), UTF-16, or bytes that
  // no JSONL file holds (NUL). A UTF-8 byte-order mark is skipped.
  InputFile(const std::string& path, int64_t max_line_bytes);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // The next line, without its newline. kTooLong: `line` holds the line's
  // first kKeptPrefix bytes and `length` its full length in bytes. Blocks
  // for I/O; a line over the limit is read through (at disk or
  // decompression speed) before this returns. Throws tandem::Error on a
  // read error or on corrupt or truncated compressed data, naming where in
  // the file and how far into the decoded input.
  Got next(std::string& line, uint64_t& length);

  Format format() const { return format_; }
  // Whether reading the data through verifies it (gzip's CRC-32 per member,
  // zstd's frame checksums when it was written with them): plain text and
  // zstd written with --no-check carry nothing to verify.
  bool checksummed() const;
  static std::string_view name(Format f);
  int64_t max_line_bytes() const { return max_line_bytes_; }

  class Source;  // bytes of the input, decoded (input_file.cpp)

 private:
  // Refills the buffer; false at the end of the input.
  bool fill();

  std::string path_;
  int64_t max_line_bytes_;
  Format format_ = Format::kPlain;
  std::unique_ptr<Source> source_;
  std::string buf_;        // decoded bytes not yet returned
  std::size_t pos_ = 0;    // first unread byte of buf_
  bool eof_ = false;
};

}  // namespace tandem::router
