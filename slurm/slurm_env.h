// What Slurm tells a job step through its environment. Outside Slurm every
// field keeps its default and in_slurm is false.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::slurm {

struct SlurmEnv {
  bool in_slurm = false;
  std::string job_id;          // SLURM_JOB_ID
  int64_t array_task_id = -1;  // SLURM_ARRAY_TASK_ID; -1 outside an array
  int64_t array_task_min = 0;  // SLURM_ARRAY_TASK_MIN
  int64_t array_task_count = 1;  // SLURM_ARRAY_TASK_COUNT
  int64_t array_task_stride = 1;  // between consecutive task ids: 1, or the step of --array=A-B:S
  int64_t ntasks = 1;          // SLURM_NTASKS
  int64_t procid = 0;          // SLURM_PROCID
  std::string nodelist;        // SLURM_JOB_NODELIST (hostlist expression)
  int64_t restart_count = 0;   // SLURM_RESTART_COUNT: > 0 after a requeue

  // Throws tandem::Error (one line) for an array whose task ids are not
  // evenly spaced (--array=1,2,5): a task could not tell its share of the input.
  static SlurmEnv from_environment();
  // This task's shard of an array job: index in [0, count), its place among the task ids.
  int64_t shard_index() const {
    return array_task_id < 0 ? 0 : (array_task_id - array_task_min) / std::max<int64_t>(1, array_task_stride);
  }
  int64_t shard_count() const { return array_task_id < 0 ? 1 : array_task_count; }
  // One line for the job's log: job, array task, tasks, expanded nodes, restarts.
  std::string describe() const;
};

// The output path of one array task: "{task}" in the path becomes the task
// id; without it, ".task<ID>" goes before the extension. Unchanged outside arrays.
std::string shard_output_path(const std::string& path, const SlurmEnv& env);

}  // namespace tandem::slurm
