// The input as it streams: plain, gzip and zstd read alike, lines bounded,
// anything that is not JSONL text refused before any work.
#include <zstd.h>

#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "router/input_file.h"
#include "input_files.h"

namespace fs = std::filesystem;
using tandem::router::InputFile;

namespace {

struct TempDir : tandem::testing::TempDir {
  TempDir() : tandem::testing::TempDir("tandem-input") {}
};
using tandem::testing::gzip;
using tandem::testing::zstd;

std::vector<std::string> all_lines(InputFile& in) {
  std::vector<std::string> lines;
  std::string line;
  uint64_t length = 0;
  while (in.next(line, length) != InputFile::Got::kEnd) lines.push_back(line);
  return lines;
}

std::string error_of(const std::string& path) {
  try {
    InputFile in(path, 1 << 20);
    all_lines(in);
  } catch (const tandem::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("plain, gzip and zstd input give the same lines, whatever the file is called", "[router][input]") {
  TempDir t;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "{\"custom_id\":\"r" + std::to_string(i) + "\",\"prompt\":\"hello\"}\n";
  text += "\r\n{\"last\":\"no newline\"}";
  InputFile plain(t.write("in.jsonl", text), 1 << 20);
  const auto want = all_lines(plain);
  REQUIRE(want.size() == 20002);
  CHECK(want[20000] == "\r");
  CHECK(want.back() == "{\"last\":\"no newline\"}");
  InputFile gz(t.write("in.jsonl.gz", gzip(text)), 1 << 20);
  CHECK(gz.format() == InputFile::Format::kGzip);
  CHECK(all_lines(gz) == want);
  InputFile zs(t.write("named-wrongly.jsonl", zstd(text)), 1 << 20);
  CHECK(zs.format() == InputFile::Format::kZstd);
  CHECK(all_lines(zs) == want);
  // Two gzip members one after the other (cat a.gz b.gz) are one stream, as gunzip reads them.
  InputFile two(t.write("two.gz", gzip("a\n") + gzip("b\n")), 1 << 20);
  CHECK(all_lines(two) == std::vector<std::string>{"a", "b"});
  // A UTF-8 byte-order mark is not part of the first line.
  InputFile bom(t.write("bom.jsonl", "\xEF\xBB\xBF{}\n"), 1 << 20);
  CHECK(all_lines(bom) == std::vector<std::string>{"{}"});
}

TEST_CASE("a line over the limit is skipped, not held: its first bytes and its length come back", "[router][input]") {
  TempDir t;
  const std::string huge = "{\"custom_id\":\"big\",\"prompt\":\"" + std::string(5'000'000, 'x') + "\"}";
  const std::string text = "{\"a\":1}\n" + huge + "\n{\"b\":2}\n";
  for (const std::string& bytes : {text, gzip(text), zstd(text)}) {
    InputFile in(t.write("in", bytes), 1 << 20);
    std::string line;
    uint64_t length = 0;
    CHECK(in.next(line, length) == InputFile::Got::kLine);
    CHECK(line == "{\"a\":1}");
    CHECK(in.next(line, length) == InputFile::Got::kTooLong);
    CHECK(length == huge.size());
    CHECK(line == huge.substr(0, InputFile::kKeptPrefix));
    CHECK(line.capacity() < 2 * InputFile::kKeptPrefix);
    CHECK(in.next(line, length) == InputFile::Got::kLine);
    CHECK(line == "{\"b\":2}");
    CHECK(in.next(line, length) == InputFile::Got::kEnd);
  }
  // Exactly at the limit is fine.
  InputFile at(t.write("at", std::string(100, 'y') + "\n"), 100);
  std::string line;
  uint64_t length = 0;
  CHECK(at.next(line, length) == InputFile::Got::kLine);
  InputFile over(t.write("over", std::string(101, 'y')), 100);
  CHECK(over.next(line, length) == InputFile::Got::kTooLong);
  CHECK(length == 101);
}

TEST_CASE("input that is not JSONL text stops with one line saying what it looks like", "[router][input]") {
  TempDir t;
  CHECK_THAT(error_of(t.write("a.bz2", "BZh91AY&SY\x01\x02")), Catch::Contains("looks like bzip2-compressed"));
  CHECK_THAT(error_of(t.write("a.xz", std::string("\xFD" "7zXZ\0\0", 8))), Catch::Contains("looks like xz-compressed"));
  CHECK_THAT(error_of(t.write("a.zip", "PK\x03\x04rest")), Catch::Contains("looks like a zip archive"));
  CHECK_THAT(error_of(t.write("a.parquet", "PAR1....")), Catch::Contains("looks like a Parquet file"));
  CHECK_THAT(error_of(t.write("a.bin", std::string("{\"a\"\0\x01", 6))), Catch::Contains("NUL byte at byte 4"));
  CHECK_THAT(error_of(t.write("a.u16", "\xFF\xFE{\0")), Catch::Contains("UTF-16"));
  CHECK_THAT(error_of(t.write("inner.gz", gzip(std::string("PK\x03\x04zipped")))),
             Catch::Contains("(gzip) looks like a zip archive"));
  CHECK_THAT(error_of((t.dir / "missing.jsonl").string()), Catch::Contains("cannot read the input"));
  for (const auto& msg : {error_of(t.write("a.bz2", "BZh9")), error_of(t.write("n", std::string(3, '\0')))})
    CHECK(msg.find('\n') == std::string::npos);
  CHECK(error_of(t.write("empty.jsonl", "")).empty());  // an empty input is a job with nothing to do
}

TEST_CASE("truncated or corrupt compressed input: the lines before it, then one line naming where", "[router][input]") {
  // (The job reads compressed input through before any work, router/input_scan.h: these lines are never run.)
  TempDir t;
  std::string text;
  for (int i = 0; i < 50000; ++i) text += "{\"custom_id\":\"r" + std::to_string(i) + "\"}\n";
  for (const bool use_zstd : {false, true}) {
    INFO((use_zstd ? "zstd" : "gzip"));
    const std::string whole = use_zstd ? zstd(text) : gzip(text);
    InputFile in(t.write("cut", whole.substr(0, whole.size() * 2 / 3)), 1 << 20);
    std::vector<std::string> lines;
    std::string line, error;
    uint64_t length = 0;
    try {
      while (in.next(line, length) != InputFile::Got::kEnd) lines.push_back(line);
    } catch (const tandem::Error& e) {
      error = e.what();
    }
    CHECK_THAT(error, Catch::Contains("data is truncated at byte") && Catch::Contains("bytes of decoded input") &&
                          Catch::Contains(use_zstd ? "zstd -t" : "gzip -t"));
    CHECK(lines.size() > 1000);
    CHECK(lines.size() < 50000);
    CHECK(lines[1000] == "{\"custom_id\":\"r1000\"}");
  }
  std::string bad = gzip(text);
  for (std::size_t i = 200; i < 260; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5A);
  CHECK_THAT(error_of(t.write("bad.gz", bad)), Catch::Contains("gzip data is corrupt at byte"));
}

TEST_CASE("gzip members one after another are one input; zero padding after them is allowed, other bytes are not",
          "[router][input]") {
  TempDir t;
  const std::string a = "{\"custom_id\":\"a\"}\n", b = "{\"custom_id\":\"b\"}\n";
  InputFile two(t.write("two.gz", gzip(a) + gzip(b)), 1 << 20);
  CHECK(all_lines(two) == std::vector<std::string>{"{\"custom_id\":\"a\"}", "{\"custom_id\":\"b\"}"});
  CHECK(two.checksummed());
  InputFile padded(t.write("padded.gz", gzip(a) + std::string(512, '\0')), 1 << 20);
  CHECK(all_lines(padded).size() == 1);
  CHECK_THAT(error_of(t.write("junk.gz", gzip(a) + "junk")), Catch::Contains("gzip data is corrupt"));
  CHECK_THAT(error_of(t.write("padjunk.gz", gzip(a) + std::string(8, '\0') + "x")),
             Catch::Contains("data after the zero bytes"));
}

TEST_CASE("zstd input says whether it carries checksums", "[router][input]") {
  TempDir t;
  const std::string text = "{\"custom_id\":\"a\"}\n";
  InputFile plain_frame(t.write("nocheck.zst", zstd(text)), 1 << 20);  // the library's default: no checksum
  CHECK_FALSE(plain_frame.checksummed());
  ZSTD_CCtx* c = ZSTD_createCCtx();
  REQUIRE(!ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1)));
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const std::size_t n = ZSTD_compress2(c, out.data(), out.size(), text.data(), text.size());
  ZSTD_freeCCtx(c);
  REQUIRE(!ZSTD_isError(n));
  out.resize(n);
  InputFile checked(t.write("check.zst", out), 1 << 20);
  CHECK(checked.checksummed());
  CHECK(all_lines(checked).size() == 1);
  InputFile plain(t.write("plain.jsonl", text), 1 << 20);
  CHECK_FALSE(plain.checksummed());
}
