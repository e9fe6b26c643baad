// The checkpoint's keys: custom_ids and line numbers never stand for each
// other, old checkpoints read as they were meant, and the sets that hold
// them stay small.
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

}  // namespace

TEST_CASE("a custom_id that looks like a line key is not the line's key", "[slurm]") {
  const fs::path dir = fresh_dir("tandem-keys");
  const std::string out = (dir / "out.jsonl").string();
  DoneKeys done;
  {
    ResumableOutput first(out, false, done);
    first.write(OutputKey::id("#line:2"), "{\"custom_id\":\"#line:2\"}");  // a real request of that name
    first.write(OutputKey::id("{\"line\":3}"), "{}");
    first.commit();
  }
  DoneKeys again;
  ResumableOutput resumed(out, true, again);
  CHECK(again.size() == 2);
  CHECK(again.contains(OutputKey::id("#line:2")));
  CHECK(again.contains(OutputKey::id("{\"line\":3}")));
  CHECK_FALSE(again.contains(OutputKey::of_line(2)));  // the unparsable line 2 is still to do
  CHECK_FALSE(again.contains(OutputKey::of_line(3)));
  fs::remove_all(dir);
}

TEST_CASE("line keys round-trip through the checkpoint apart from ids", "[slurm]") {
  const fs::path dir = fresh_dir("tandem-linekeys");
  const std::string out = (dir / "out.jsonl").string();
  DoneKeys done;
  {
    ResumableOutput first(out, false, done);
    first.write(OutputKey::of_line(7), "{\"error\":1}");
    first.commit();
    first.write(OutputKey::id("7"), "{}");  // never committed: not done on resume
  }
  DoneKeys again;
  ResumableOutput resumed(out, true, again);
  CHECK(again.contains(OutputKey::of_line(7)));
  CHECK_FALSE(again.contains(OutputKey::id("7")));
  CHECK_FALSE(again.contains(OutputKey::of_line(8)));
  fs::remove_all(dir);
}

TEST_CASE("a checkpoint from before the key records is read as it was meant", "[slurm]") {
  const fs::path dir = fresh_dir("tandem-legacy");
  const std::string out = (dir / "out.jsonl").string();
  std::ofstream(out) << "{\"a\":1}\n{\"b\":2}\n";
  std::ofstream(out + ".ckpt") << "\"r1\"\n\"#line:2\"\n{\"committed_bytes\":16}\n";
  DoneKeys done;
  ResumableOutput resumed(out, true, done);
  CHECK(done.contains(OutputKey::id("r1")));
  CHECK(done.contains(OutputKey::of_line(2)));
  CHECK_FALSE(done.contains(OutputKey::id("#line:2")));
  CHECK(resumed.committed_bytes() == 16);
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
