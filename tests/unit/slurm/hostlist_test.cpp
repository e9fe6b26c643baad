#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <unordered_set>

#include <unistd.h>

#include "common/error.h"
#include "slurm/hostlist.h"
#include "slurm/resumable_output.h"
#include "slurm/slurm_env.h"

using tandem::slurm::expand_hostlist;

namespace {

// Slurm's own expansion: `scontrol show hostnames`, with a minimal config so it runs offline.
std::vector<std::string> scontrol(const std::string& expr, const std::string& conf) {
  const std::string cmd = "SLURM_CONF=" + conf + " scontrol show hostnames '" + expr + "' 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  std::vector<std::string> out;
  char buf[512];
  while (p && std::fgets(buf, sizeof buf, p.get())) {
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (!s.empty()) out.push_back(s);
  }
  return out;
}

}  // namespace

// Slurm itself rejects text after a bracket unless another bracket follows
// ("node-[1-3]-ib"), and orders three or more bracket groups its own way; job
// nodelists never take those forms, so they are not compared here.
TEST_CASE("hostlists expand exactly as scontrol show hostnames does", "[slurm]") {
  const auto conf = std::filesystem::temp_directory_path() / ("tandem-hostlist-" + std::to_string(::getpid()) + ".conf");
  std::ofstream(conf) << "ClusterName=t\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\n"
                         "PartitionName=p Nodes=localhost Default=YES\n";
  const std::vector<std::string> exprs = {
      "node1",
      "node[1-3]",
      "node[01-03]",
      "node[001-010]",
      "node[8-11]",
      "node[09-11]",
      "n[1,3,5]",
      "n[1-2,7,10-12]",
      "a,b,c",
      "gpu[1-2],cpu[01-02]",
      "rack[1-2]-node[1-3]",
      "nid[00010-00012]",
      "cn-[1-3]",
      "x[0-0]",
      "node[1-3],node5",
      "login1,node[10-12],gpu01",
      "c[0998-1001]",
      "a[1-3],a[5-6]",
      "node[1],node[2-3]",
      "abc123",
      "n[7]x[1-2]",
      "big[1-150]",
  };
  bool have_scontrol = !scontrol("a[1-2]", conf.string()).empty();
  if (!have_scontrol) WARN("scontrol is not installed or cannot run here: comparing with the expected lists only");
  for (const auto& e : exprs) {
    INFO(e);
    const auto ours = expand_hostlist(e);
    if (have_scontrol) CHECK(ours == scontrol(e, conf.string()));
  }
  std::filesystem::remove(conf);
  CHECK(expand_hostlist("node[01-03]") == std::vector<std::string>{"node01", "node02", "node03"});
  CHECK(expand_hostlist("r[1-2]n[1-2]") == std::vector<std::string>{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(expand_hostlist("n[1,3-4],m") == std::vector<std::string>{"n1", "n3", "n4", "m"});
}

TEST_CASE("malformed hostlists are one clear error", "[slurm]") {
  CHECK_THROWS_WITH(expand_hostlist("node[1-3"), "hostlist 'node[1-3': '[' without ']'");
  CHECK_THROWS_WITH(expand_hostlist("node[3-1]"), "hostlist 'node[3-1]': range '3-1' runs backwards");
  CHECK_THROWS_WITH(expand_hostlist("node[a-b]"), Catch::Contains("'a-b' is not a number or a range"));
}

TEST_CASE("array tasks get their shard and their own output", "[slurm]") {
  tandem::slurm::SlurmEnv e;
  CHECK(tandem::slurm::shard_output_path("out.jsonl", e) == "out.jsonl");
  e.in_slurm = true;
  e.array_task_id = 5;
  e.array_task_min = 4;
  e.array_task_count = 3;
  CHECK(e.shard_index() == 1);
  CHECK(e.shard_count() == 3);
  CHECK(tandem::slurm::shard_output_path("/scratch/out.jsonl", e) == "/scratch/out.task5.jsonl");
  CHECK(tandem::slurm::shard_output_path("/scratch/run.d/out", e) == "/scratch/run.d/out.task5");
  CHECK(tandem::slurm::shard_output_path("res-{task}.jsonl", e) == "res-5.jsonl");
}

TEST_CASE("array tasks: a stepped array shards by place; a list with uneven ids is refused", "[slurm]") {
  auto env = [](const char* id, const char* min, const char* max, const char* count, const char* step) {
    ::setenv("SLURM_JOB_ID", "77", 1);
    ::setenv("SLURM_ARRAY_TASK_ID", id, 1);
    ::setenv("SLURM_ARRAY_TASK_MIN", min, 1);
    ::setenv("SLURM_ARRAY_TASK_MAX", max, 1);
    ::setenv("SLURM_ARRAY_TASK_COUNT", count, 1);
    if (step) ::setenv("SLURM_ARRAY_TASK_STEP", step, 1);
    else ::unsetenv("SLURM_ARRAY_TASK_STEP");
  };
  env("2", "0", "2", "2", "2");  // --array=0-2:2, the second task
  auto e = tandem::slurm::SlurmEnv::from_environment();
  CHECK(e.shard_index() == 1);
  CHECK(e.shard_count() == 2);
  env("30", "10", "40", "4", nullptr);  // --array=10,20,30,40 (no step given)
  CHECK(tandem::slurm::SlurmEnv::from_environment().shard_index() == 2);
  env("7", "3", "9", "3", nullptr);  // --array=3-9:3 ids are 3, 6, 9: 7 is not one of them
  CHECK_THROWS_WITH(tandem::slurm::SlurmEnv::from_environment(), Catch::Contains("not evenly spaced"));
  env("2", "1", "5", "3", nullptr);  // --array=1,2,5
  CHECK_THROWS_WITH(tandem::slurm::SlurmEnv::from_environment(),
                    Catch::Contains("array task 2: the array's task ids (1 to 5, 3 tasks) are not evenly spaced"));
  env("4", "4", "4", "1", nullptr);  // a one-task array: the whole input
  CHECK(tandem::slurm::SlurmEnv::from_environment().shard_index() == 0);
  for (const char* v : {"SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX",
                        "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_STEP"})
    ::unsetenv(v);
}

TEST_CASE("one job at a time on an output: a second writer is refused with one line, then may resume", "[slurm]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem-lock-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string out = (dir / "out.jsonl").string();
  using tandem::slurm::OutputKey;
  {
    tandem::slurm::ResumableOutput first(out, false);
    first.write(OutputKey::id("a", 1), "{\"custom_id\":\"a\"}");
    first.commit();
    CHECK_THROWS_WITH(tandem::slurm::ResumableOutput(out, true),
                      Catch::Contains("another job is writing this output now"));
    // The refused writer changed nothing: the first one's line is still there and committed.
    first.write(OutputKey::id("b", 2), "{\"custom_id\":\"b\"}");
    first.commit();
  }
  tandem::slurm::ResumableOutput again(out, true);  // the first one ended: its lock went with it
  tandem::slurm::DoneKeys done;
  tandem::slurm::read_checkpoint(out, [&](const OutputKey& k) { done.insert(k); });
  CHECK(done.size() == 2);
  CHECK(done.contains(OutputKey::id("a", 1)));
  CHECK(done.contains(OutputKey::id("b", 2)));
  // A refused fresh start (no checkpoint to resume from) leaves no checkpoint behind.
  const std::string other = (dir / "other.jsonl").string();
  std::ofstream(other) << "{}\n";
  CHECK_THROWS_WITH(tandem::slurm::ResumableOutput(other, true), Catch::Contains("has no checkpoint"));
  CHECK(!fs::exists(other + ".ckpt"));
  fs::remove_all(dir);
}
