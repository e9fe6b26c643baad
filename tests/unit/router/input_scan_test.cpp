// What rank 0 reads before any work: a damaged compressed input stops the
// job, a resume matches every answered line by key and text, and the keys
// are the ones the job writes.
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "router/input_scan.h"
#include "router/line_key.h"
#include "slurm/resumable_output.h"
#include "input_files.h"

namespace fs = std::filesystem;
using tandem::router::InputScan;
using tandem::router::line_key_id;
using tandem::router::line_text_hash;
using tandem::router::LineKeys;
using tandem::slurm::OutputKey;

namespace {

struct TempDir : tandem::testing::TempDir {
  TempDir() : tandem::testing::TempDir("tandem-scan") {}
};
using tandem::testing::gzip;

std::string lines_of(int n, const std::string& word, int from = 0) {
  std::string text;
  for (int i = from; i < from + n; ++i)
    text += "{\"custom_id\":\"q" + std::to_string(i) + "\",\"prompt\":\"" + word + " " + std::to_string(i) + "\"}\n";
  return text;
}

// Writes an output for `text`'s lines 0..answered-1 as the job would key them.
void answer(const std::string& out, const std::string& text, int answered) {
  tandem::slurm::ResumableOutput o(out, false);
  LineKeys keys;
  std::size_t at = 0;
  for (int i = 0; i < answered; ++i) {
    const std::size_t nl = text.find('\n', at);
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    o.write(keys.key(static_cast<uint64_t>(i), line_key_id(line), line_text_hash(line, line.size())), "{}");
  }
  o.commit();
}

}  // namespace

TEST_CASE("a line's key id is its first top-level custom_id string, read only as far as the line is valid",
          "[router][input]") {
  CHECK(line_key_id(R"({"custom_id":"a","prompt":"x"})") == "a");
  CHECK(line_key_id(R"({"body":{"custom_id":"inner"},"custom_id":"outer"})") == "outer");
  CHECK(line_key_id(R"({"custom_id":"caf\u00e9 \"q\""})") == "caf\xc3\xa9 \"q\"");
  CHECK(line_key_id(R"({"custom_id":"kept", "prompt": broken)") == "kept");  // an error record carries it
  CHECK(line_key_id(R"({"prompt": broken, "custom_id":"late"})") == "");
  CHECK(line_key_id(R"({"custom_id":7})") == "");
  CHECK(line_key_id(R"({"custom_id":{"x":"y"}})") == "");
  CHECK(line_key_id(R"(["custom_id","a"])") == "");
  CHECK(line_key_id("") == "");
  CHECK(line_text_hash("abc", 3) != line_text_hash("abd", 3));
  CHECK(line_text_hash("abc", 3) != line_text_hash("abc", 4));  // a long line's kept prefix with another length
  LineKeys keys;
  CHECK_FALSE(keys.key(0, "a", 1).is_line());
  CHECK(keys.key(1, "a", 2).line == 2);  // a duplicate id: keyed by its line number
  CHECK(keys.key(2, "", 3).line == 3);
}

TEST_CASE("plain input without a checkpoint needs no reading through and compressed input is read whole",
          "[router][input]") {
  TempDir t;
  const std::string text = lines_of(500, "hello");
  CHECK(InputScan::run({t.write("in.jsonl", text), t.path("out.jsonl")}) == nullptr);
  const auto scan = InputScan::run({t.write("in.gz", gzip(text)), t.path("out.jsonl")});
  REQUIRE(scan);
  CHECK(scan->lines() == 500);
  CHECK(scan->requests() == 500);
  CHECK(scan->answered() == 0);
  CHECK(scan->changed().empty());
  std::string bad = gzip(text);
  for (std::size_t i = bad.size() / 2; i < bad.size() / 2 + 20; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5A);
  CHECK_THROWS_WITH(InputScan::run({t.write("bad.gz", bad), t.path("out.jsonl")}),
                    Catch::Contains("gzip data is corrupt at byte") && Catch::Contains("nothing was run"));
  const std::string whole = gzip(text);
  CHECK_THROWS_WITH(InputScan::run({t.write("cut.gz", whole.substr(0, whole.size() - 4)), t.path("out.jsonl")}),
                    Catch::Contains("truncated") && Catch::Contains("nothing was run"));
}

TEST_CASE("a resume finds answered lines by key and text wherever they are now and stops at a changed or missing one",
          "[router][input]") {
  TempDir t;
  const std::string out = t.path("out.jsonl");
  const std::string first = lines_of(200, "first");
  answer(out, first, 150);
  // The same input: 150 answered, 50 to do.
  auto scan = InputScan::run({t.write("same.jsonl", first), out, 1 << 20, true});
  REQUIRE(scan);
  CHECK(scan->answered() == 150);
  CHECK(scan->requests() == 200);
  CHECK(scan->done(0));
  CHECK(scan->done(149));
  CHECK_FALSE(scan->done(150));
  // Lines added in front, blank lines between: found where they are now.
  scan = InputScan::run({t.write("grown.jsonl", lines_of(10, "new", 500) + "\n  \n" + first), out, 1 << 20, true});
  CHECK(scan->answered() == 150);
  CHECK_FALSE(scan->done(0));
  CHECK(scan->done(12));
  // Other prompts under the same ids.
  CHECK_THROWS_WITH(InputScan::run({t.write("other.jsonl", lines_of(200, "second")), out, 1 << 20, true}),
                    Catch::Contains("its answers are for another input") &&
                        Catch::Contains("150 line(s) it answered hold other text there now (the first: line 1, "
                                        "custom_id 'q0')") &&
                        Catch::Contains("nothing was run"));
  // Fewer lines than were answered.
  CHECK_THROWS_WITH(InputScan::run({t.write("short.jsonl", lines_of(100, "first")), out, 1 << 20, true}),
                    Catch::Contains("50 line(s) it answered are not there (the first: custom_id 'q100')"));
  // One line changed by a byte.
  std::string edited = first;
  edited[edited.find("first 7\"")] = 'F';
  CHECK_THROWS_WITH(InputScan::run({t.write("edited.jsonl", edited), out, 1 << 20, true}),
                    Catch::Contains("1 line(s) it answered hold other text there now (the first: line 8, custom_id 'q7')"));
  // Compressed, the same lines: resumes.
  scan = InputScan::run({t.write("same.gz", gzip(first)), out, 1 << 20, true});
  CHECK(scan->answered() == 150);
}

TEST_CASE("a resume keys lines without a usable custom_id by their number and matches them by text too",
          "[router][input]") {
  TempDir t;
  const std::string out = t.path("out.jsonl");
  const std::string text = "not json\n{\"custom_id\":\"a\"}\n{\"custom_id\":\"a\"}\n{\"prompt\":\"no id\"}\n";
  answer(out, text, 4);
  auto scan = InputScan::run({t.write("in.jsonl", text), out, 1 << 20, true});
  CHECK(scan->answered() == 4);
  CHECK_THROWS_WITH(InputScan::run({t.write("moved.jsonl", "\n" + text), out, 1 << 20, true}),
                    Catch::Contains("the answer to line 1, which had no usable custom_id"));
}

TEST_CASE("an array task's share is matched alone", "[router][input]") {
  TempDir t;
  const std::string out = t.path("out.jsonl");
  const std::string text = lines_of(10, "x");
  {
    tandem::slurm::ResumableOutput o(out, false);
    LineKeys keys;
    std::size_t at = 0;
    for (int i = 0; i < 10; ++i) {
      const std::size_t nl = text.find('\n', at);
      const std::string line = text.substr(at, nl - at);
      at = nl + 1;
      if (i % 3 == 1 && i < 7) o.write(keys.key(static_cast<uint64_t>(i), line_key_id(line), line_text_hash(line, line.size())), "{}");
    }
    o.commit();
  }
  const auto scan = InputScan::run({t.write("in.jsonl", text), out, 1 << 20, true, 1, 3});
  CHECK(scan->requests() == 3);  // lines 1, 4, 7
  CHECK(scan->answered() == 2);
  CHECK(scan->done(1));
  CHECK(scan->done(4));
  CHECK_FALSE(scan->done(7));
}

TEST_CASE("the input is the file that was read, or the job says it changed", "[router][input]") {
  TempDir t;
  const std::string path = t.write("in.gz", gzip(lines_of(5, "x")));
  const auto scan = InputScan::run({path, t.path("out.jsonl")});
  REQUIRE(scan);
  CHECK(scan->changed().empty());
  t.write("in.gz", gzip(lines_of(6, "x")));
  CHECK_THAT(scan->changed(), Catch::Contains("changed since it was read at start-up"));
}
