// The checkpoint's keys: custom_ids and line numbers never stand for each
// other, a record is done only with the input text it answered, old
// checkpoints read as they were meant, damage is refused (a torn tail is
// not damage), and the sets that hold them stay small.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <catch2/catch.hpp>

#include "common/u64_set.h"
#include "slurm/resumable_output.h"

namespace fs = std::filesystem;
using tandem::slurm::DoneKeys;
using tandem::slurm::OutputKey;
using tandem::slurm::ResumableOutput;

namespace {

fs::path fresh_dir(const char* name) {
  const fs::path dir = fs::temp_directory_path() / (std::string(name) + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

DoneKeys done_in(const std::string& out) {
  DoneKeys done;
  tandem::slurm::read_checkpoint(out, [&](const OutputKey& k) { done.insert(k); });
  return done;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

}  // namespace

TEST_CASE("a custom_id that looks like a line key is not the line's key", "[slurm]") {
  const fs::path dir = fresh_dir("tandem-keys");
  const std::string out = (dir / "out.jsonl").string();
  {
    ResumableOutput first(out, false);
    first.write(OutputKey::id("#line:2", 5), "{\"custom_id\":\"#line:2\"}");  // a real request of that name
    first.write(OutputKey::id("{\"line\":3}", 6), "{}");
    first.commit();
  }
  ResumableOutput resumed(out, true);
  const DoneKeys again = done_in(out);
  CHECK(again.size() == 2);
  CHECK(again.contains(OutputKey::id("#line:2", 5)));
  CHECK(again.contains(OutputKey::id("{\"line\":3}", 6)));
  CHECK_FALSE(again.contains(OutputKey::of_line(2, 5)));  // the unparsable line 2 is still to do
  CHECK_FALSE(again.contains(OutputKey::of_line(3, 6)));
  fs::remove_all(dir);
}

TEST_CASE("a record is done only with the input text it answered", "[slurm]") {
  const fs::path dir = fresh_dir("tandem-texthash");
  const std::string out = (dir / "out.jsonl").string();
  {
    ResumableOutput first(out, false);
    first.write(OutputKey::id("q0", 0x1234), "{}");
    first.write(OutputKey::of_line(9, 0x99), "{}");
    first.commit();
  }
  const DoneKeys done = done_in(out);
  CHECK(done.contains(OutputKey::id("q0", 0x1234)));
  CHECK_FALSE(done.contains(OutputKey::id("q0", 0x1235)));  // the same id, other text: not this line's answer
  CHECK(done.contains(OutputKey::of_line(9, 0x99)));
  CHECK_FALSE(done.contains(OutputKey::of_line(9, 0x98)));
  CHECK(done.without_input_hash() == 0);
  fs::remove_all(dir);
}

TEST_CASE("line keys round-trip through the checkpoint apart from ids", "[slurm]") {
  const fs::path dir = fresh_dir("tandem-linekeys");
  const std::string out = (dir / "out.jsonl").string();
  {
    ResumableOutput first(out, false);
    first.write(OutputKey::of_line(7, 1), "{\"error\":1}");
    first.commit();
    first.write(OutputKey::id("7", 1), "{}");  // never committed: not done on resume
  }
  ResumableOutput resumed(out, true);
  const DoneKeys again = done_in(out);
  CHECK(again.contains(OutputKey::of_line(7, 1)));
  CHECK_FALSE(again.contains(OutputKey::id("7", 1)));
  CHECK_FALSE(again.contains(OutputKey::of_line(8, 1)));
  CHECK(resumed.committed_bytes() == 12);
  CHECK(fs::file_size(out) == 12);  // the uncommitted line was cut away
  fs::remove_all(dir);
}

TEST_CASE("checkpoints from before the key records and the input hashes are read as they were meant", "[slurm]") {
  const fs::path dir = fresh_dir("tandem-legacy");
  const std::string out = (dir / "out.jsonl").string();
  write_all(out, "{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n");
  write_all(out + ".ckpt", "\"r1\"\n\"#line:2\"\n{\"committed_bytes\":16}\n{\"id\":\"r3\"}\n{\"committed_bytes\":24}\n");
  {
    ResumableOutput resumed(out, true);
    CHECK(resumed.committed_bytes() == 24);
    resumed.write(OutputKey::id("r4", 44), "{\"d\":4}");  // a new commit after old ones carries a checksum
    resumed.commit();
  }
  const DoneKeys done = done_in(out);
  CHECK(done.without_input_hash() == 3);
  CHECK(done.contains(OutputKey::id("r1", 77)));  // by its key alone, whatever the text
  CHECK(done.contains(OutputKey::of_line(2, 0)));
  CHECK_FALSE(done.contains(OutputKey::id("#line:2", 0)));
  CHECK(done.contains(OutputKey::id("r3", 1)));
  CHECK(done.contains(OutputKey::id("r4", 44)));
  CHECK_FALSE(done.contains(OutputKey::id("r4", 45)));
  fs::remove_all(dir);
}

TEST_CASE("a damaged checkpoint is refused with one line, never read as fewer lines done", "[slurm]") {
  const fs::path dir = fresh_dir("tandem-damage");
  const std::string out = (dir / "out.jsonl").string();
  {
    ResumableOutput first(out, false);
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 4; ++i) first.write(OutputKey::id("q" + std::to_string(c * 4 + i), 10 + i), "{\"x\":1}");
      first.commit();
    }
  }
  const std::string good = read_all(out + ".ckpt");
  REQUIRE(done_in(out).size() == 12);
  // The checkpoint's lines, to damage one at a time.
  std::vector<std::string> lines;
  for (std::size_t at = 0; at < good.size();) {
    const std::size_t nl = good.find('\n', at);
    lines.push_back(good.substr(at, nl - at));
    at = nl + 1;
  }
  REQUIRE(lines.size() == 15);
  auto with = [&](std::size_t i, const std::string& line) {
    std::string text;
    for (std::size_t j = 0; j < lines.size(); ++j) text += (j == i ? line : lines[j]) + "\n";
    return text;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"8 bytes inserted into a record", with(1, lines[1].substr(0, 5) + "XXXXXXXX" + lines[1].substr(5))},
      {"a record's id changed", with(6, "{\"id\":\"qX\",\"h\":\"000000000000000b\"}")},
      {"a record's input hash changed", with(2, lines[2].substr(0, lines[2].size() - 3) + "f\"}")},
      {"a record removed", with(7, "")},
      {"a committed length changed", with(9, "{\"committed_bytes\":99,\"records\":4,\"sum\":\"0000000000000000\"}")},
      {"committed_bytes negative", with(4, "{\"committed_bytes\":-5}")},
      {"committed_bytes not a number", with(4, "{\"committed_bytes\":\"8\"}")},
      {"a commit's checksum dropped after checksummed ones", with(9, "{\"committed_bytes\":" +
                                                                        std::to_string(fs::file_size(out) * 2 / 3) + "}")},
  };
  for (const auto& [what, text] : cases) {
    INFO(what);
    write_all(out + ".ckpt", text);
    CHECK_THROWS_WITH(done_in(out), Catch::Contains("damaged at line") && Catch::Contains("changed outside Tandem"));
    CHECK_THROWS_WITH(ResumableOutput(out, true), Catch::Contains("damaged at line"));
  }
  // A torn tail is what a crash leaves: the records after the last whole commit are simply not done.
  write_all(out + ".ckpt", good.substr(0, good.size() - 10));
  CHECK(done_in(out).size() == 8);
  write_all(out + ".ckpt", good + "{\"id\":\"q12\",\"h\":\"00000000000000");
  CHECK(done_in(out).size() == 12);
  write_all(out + ".ckpt", good + "{\"id\":\"q12\",\"h\":\"000000000000000a\"}\n");  // written, not committed
  CHECK(done_in(out).size() == 12);
  write_all(out + ".ckpt", good + "XXXX{\"id\":\"q12\"}\n");  // a whole line, no record: damage, even last
  CHECK_THROWS_WITH(done_in(out), Catch::Contains("damaged at line 16"));
  write_all(out + ".ckpt", with(14, lines[14].substr(0, 8) + "XX" + lines[14].substr(8)));  // the last commit
  CHECK_THROWS_WITH(done_in(out), Catch::Contains("damaged at line 15"));
  write_all(out + ".ckpt", good);
  CHECK(done_in(out).size() == 12);
  fs::remove_all(dir);
}

TEST_CASE("U64Set holds every key once, 0 included, in under 16 bytes a key", "[slurm]") {
  tandem::U64Set set;
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys(200000);
  for (auto& k : keys) k = rng();
  keys[5] = 0;
  for (auto k : keys) CHECK(set.insert(k));
  CHECK_FALSE(set.insert(0));
  CHECK(set.size() == keys.size());
  bool all = true;
  for (auto k : keys) all = all && set.contains(k);
  CHECK(all);
  int64_t false_hits = 0;
  for (int i = 0; i < 100000; ++i) false_hits += set.contains(rng());
  CHECK(false_hits == 0);
  // Sequential keys (line numbers) spread as well as hashes do.
  tandem::U64Set lines;
  for (uint64_t l = 1; l <= 100000; ++l) lines.insert(l);
  CHECK(lines.contains(50000));
  CHECK_FALSE(lines.contains(100001));
  CHECK(static_cast<double>(set.memory_bytes()) / static_cast<double>(set.size()) < 16.0);
  CHECK(static_cast<double>(lines.memory_bytes()) / static_cast<double>(lines.size()) < 16.0);
}

TEST_CASE("U64Set sized ahead never grows: at most 10 bytes a key, the same keys", "[slurm]") {
  tandem::U64Set set;
  set.reserve(100000);
  const std::size_t bytes = set.memory_bytes();
  std::mt19937_64 rng(3);
  std::vector<uint64_t> keys(100000);
  for (auto& k : keys) CHECK(set.insert(k = rng()));
  CHECK(set.memory_bytes() == bytes);  // no growth, so no moment with two arrays
  CHECK(static_cast<double>(bytes) / 100000.0 <= 10.0 + 1e-3);
  bool all = true;
  for (auto k : keys) all = all && set.contains(k);
  CHECK(all);
  set.reserve(10);  // smaller: nothing changes
  CHECK(set.memory_bytes() == bytes);
}

TEST_CASE("a resume cuts the checkpoint back to its last commit: a torn record never joins the next one", "[slurm]") {
  const fs::path dir = fresh_dir("tandem-torn");
  const std::string out = (dir / "out.jsonl").string();
  {
    ResumableOutput first(out, false);
    first.write(OutputKey::id("a", 1), "{}");
    first.commit();
    first.write(OutputKey::id("b", 2), "{}");  // its record is in the checkpoint, not committed
  }
  {
    std::ofstream torn(out + ".ckpt", std::ios::app | std::ios::binary);
    torn << "{\"id\":\"c\",\"h\":\"00";  // a crash in the middle of a record
  }
  CHECK(done_in(out).size() == 1);
  {
    ResumableOutput again(out, true);
    CHECK(again.committed_bytes() == 3);
    again.write(OutputKey::id("b", 2), "{}");
    again.write(OutputKey::id("c", 3), "{}");
    again.commit();
  }
  const DoneKeys done = done_in(out);  // whole: no damage, each once
  CHECK(done.size() == 3);
  CHECK(done.contains(OutputKey::id("b", 2)));
  CHECK(done.contains(OutputKey::id("c", 3)));
  fs::remove_all(dir);
}

TEST_CASE("records go to the checkpoint as lines are written: memory does not grow between commits", "[slurm]") {
  const fs::path dir = fresh_dir("tandem-stream");
  const std::string out = (dir / "out.jsonl").string();
  ResumableOutput o(out, false);
  for (int i = 0; i < 20000; ++i) o.write(OutputKey::id("request-" + std::to_string(i), 7), "{}");
  o.commit();
  CHECK(fs::file_size(out + ".ckpt") > 20000 * 30);
  CHECK(done_in(out).size() == 20000);
  fs::remove_all(dir);
}
