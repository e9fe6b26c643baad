#include "slurm/slurm_env.h"

#include <cstdlib>

#include "common/error.h"
#include "slurm/hostlist.h"

namespace tandem::slurm {
namespace {

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int64_t number(const char* name, int64_t fallback) {
  const char* v = get(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0') throw Error(std::string(name) + "='" + v + "' is not a number");
  return n;
}

}  // namespace

SlurmEnv SlurmEnv::from_environment() {
  SlurmEnv e;
  e.in_slurm = get("SLURM_JOB_ID") != nullptr;
  if (!e.in_slurm) return e;
  e.job_id = get("SLURM_JOB_ID");
  e.array_task_id = number("SLURM_ARRAY_TASK_ID", -1);
  e.array_task_min = number("SLURM_ARRAY_TASK_MIN", e.array_task_id < 0 ? 0 : e.array_task_id);
  e.array_task_count = number("SLURM_ARRAY_TASK_COUNT", 1);
  if (e.array_task_id >= 0 && e.array_task_count > 1) {
    // --array=0-9 and 0-90:10 have evenly spaced ids: a task's place is (id - min) / stride.
    // A list (1,2,5) would shard by guesswork and lose lines: refused.
    const int64_t max = number("SLURM_ARRAY_TASK_MAX", e.array_task_id), step = number("SLURM_ARRAY_TASK_STEP", 0);
    const int64_t span = max - e.array_task_min, gaps = e.array_task_count - 1;
    const int64_t stride = span > 0 && span % gaps == 0 ? span / gaps : 0;
    if (stride <= 0 || (step > 0 && step != stride) || e.array_task_id < e.array_task_min || e.array_task_id > max ||
        (e.array_task_id - e.array_task_min) % stride != 0) {
      throw Error("Slurm array task " + std::to_string(e.array_task_id) + ": the array's task ids (" +
                  std::to_string(e.array_task_min) + " to " + std::to_string(max) + ", " +
                  std::to_string(e.array_task_count) + " tasks) are not evenly spaced, so a task cannot tell which "
                  "share of the input is its own; submit --array=0-" + std::to_string(gaps) +
                  " (a step such as --array=0-" + std::to_string(gaps * 10) + ":10 works too)");
    }
    e.array_task_stride = stride;
  }
  e.ntasks = number("SLURM_NTASKS", 1);
  e.procid = number("SLURM_PROCID", 0);
  if (const char* n = get("SLURM_JOB_NODELIST")) e.nodelist = n;
  else if (const char* m = get("SLURM_NODELIST")) e.nodelist = m;
  e.restart_count = number("SLURM_RESTART_COUNT", 0);
  return e;
}

std::string SlurmEnv::describe() const {
  if (!in_slurm) return "not under Slurm";
  std::string s = "Slurm job " + job_id;
  if (array_task_id >= 0)
    s += " (array task " + std::to_string(array_task_id) + ", shard " + std::to_string(shard_index() + 1) + " of " +
         std::to_string(shard_count()) + ")";
  s += ", " + std::to_string(ntasks) + " task(s)";
  if (!nodelist.empty()) {
    const auto hosts = expand_hostlist(nodelist);
    s += " on " + std::to_string(hosts.size()) + " node(s):";
    for (std::size_t i = 0; i < hosts.size() && i < 16; ++i) s += " " + hosts[i];
    if (hosts.size() > 16) s += " ...";
  }
  if (restart_count > 0) s += ", restart " + std::to_string(restart_count);
  return s;
}

std::string shard_output_path(const std::string& path, const SlurmEnv& env) {
  if (env.array_task_id < 0) return path;
  const std::string id = std::to_string(env.array_task_id);
  if (auto at = path.find("{task}"); at != std::string::npos) return path.substr(0, at) + id + path.substr(at + 6);
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + ".task" + id;
  return path.substr(0, dot) + ".task" + id + path.substr(dot);
}

}  // namespace tandem::slurm
