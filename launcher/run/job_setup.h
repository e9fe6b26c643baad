// The pieces run_job assembles (launcher/run/job.cpp): the prepared job, the
// router's setup, the worker's tiers, the planner, and the collective
// agreement on errors. Not for other callers.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "kv/tiers.h"
#include "launcher/run/job.h"
#include "launcher/run/job_checks.h"
#include "router/loop/batch_frontend.h"
#include "mpi_transport/mpi_env.h"
#include "planner/epoch_planner.h"
#include "runtime/engine/engine.h"
#include "runtime/tokenizer/chat_template.h"

namespace tandem::launcher {

// The config with the command line applied, the model's config and tokenizer.
// Throws tandem::Error (one line).
Prepared prepare(const RunOptions& o);
runtime::EngineOptions engine_options(const Prepared& p);
// How prompts are built and outputs named, the same for run and serve.
void prompt_and_output_contexts(const Prepared& p, std::unique_ptr<runtime::ChatTemplate>& chat,
                                router::PromptContext& prompts, router::OutputContext& outputs);
// The batch front end's setup, and the placement both front ends use.
router::BatchSetup router_setup(const Prepared& p, std::unique_ptr<runtime::ChatTemplate>& chat);
// The tiers under a worker's pool (kv.host_cache_gib, kv.store_path), or null.
// blocks_on_host: the blocks reach the tiers in host memory whatever the
// backend (a tensor-parallel group's, gathered by its GroupTier).
std::unique_ptr<kv::KvTiers> open_tiers(const Prepared& p, const kv::KvLayout& layout, bool first_worker,
                                        bool blocks_on_host = false);
// The end of a batch job on rank 0: the summary logged; the exit code.
int finish_run(const nlohmann::json& summary);
// One verdict for every rank: the lowest failing rank's line, printed once by rank 0.
bool agreed(const mpi::MpiEnv& env, const std::string& error);
// The planner of a job with job.mode = "auto", on rank 0.
// tp: the workers' tensor-parallel width; prefill_tp, where it differs (0:
// it does not), makes `workers` count cells of lcm(prefill_tp, tp) ranks.
std::unique_ptr<planner::EpochPlanner> make_epoch_planner(const Prepared& p, int workers, int local_workers,
                                                          const std::string& gpu_name, int tp = 1, int prefill_tp = 0);

// What a worker's setup step threw, as one line ("" when it succeeded);
// out_of_memory: what to say when it ran out of memory.
template <class Work>
std::string setup_error(Work&& work, const char* out_of_memory) {
  try {
    work();
    return "";
  } catch (const std::bad_alloc&) {
    return out_of_memory;
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace tandem::launcher
