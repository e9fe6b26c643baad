#include "launcher/run/job_setup.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/backoff.h"
#include "common/error.h"
#include "runtime/cpu/kernels.h"
#include "mpi_transport/collectives.h"
#include "mpi_transport/mpi_check.h"
#include "planner/machine.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/model/fingerprint.h"
#include "runtime/model/weights.h"
#include "slurm/resumable_output.h"
#include "slurm/slurm_env.h"

namespace tandem::launcher {
Prepared prepare(const RunOptions& o) {
  Prepared p;
  p.cfg = o.config.load();
  if (!o.model.empty()) p.cfg.model.path = o.model;
  if (!o.input.empty()) p.cfg.job.input = o.input;
  if (!o.output.empty()) p.cfg.job.output = o.output;
  if (!o.host.empty()) p.cfg.http.host = o.host;
  if (o.port >= 0) p.cfg.http.port = o.port;
  if (p.cfg.model.path.empty()) throw Error("no model: set model.path in the job file or pass --model DIR");
  if (!o.serve) {  // serve reads no input file and writes no output
    if (p.cfg.job.input.empty()) throw Error("no input: set job.input in the job file or pass --input FILE");
    if (p.cfg.job.output.empty()) throw Error("no output: set job.output in the job file or pass --output FILE");
    if (o.resume) p.cfg.job.resume = true;
    // A job array task writes its own output and takes its own shard of the input.
    p.cfg.job.output = slurm::shard_output_path(p.cfg.job.output, slurm::SlurmEnv::from_environment());
    // A requeued Slurm job continues its output.
    if (const char* restarts = std::getenv("SLURM_RESTART_COUNT"); restarts && std::atoi(restarts) > 0) p.cfg.job.resume = true;
    // Its summary too: an explicit job.summary is per task like the output ({task}, or .task<ID>).
    if (p.cfg.job.summary.empty()) p.cfg.job.summary = p.cfg.job.output + ".summary.json";
    else p.cfg.job.summary = slurm::shard_output_path(p.cfg.job.summary, slurm::SlurmEnv::from_environment());
    if (p.cfg.job.progress_file.empty()) p.cfg.job.progress_file = p.cfg.job.output + ".progress.json";
    else if (p.cfg.job.progress_file != "none")
      p.cfg.job.progress_file = slurm::shard_output_path(p.cfg.job.progress_file, slurm::SlurmEnv::from_environment());
  }
  if (!o.defaults.empty()) {
    if (!p.cfg.defaults.empty())
      throw Error("--defaults " + o.defaults + ": the job file has [defaults] too (" + p.cfg.defaults_source +
                  "); give them once");
    std::ifstream in(o.defaults, std::ios::binary);
    if (!in) throw Error("--defaults " + o.defaults + ": cannot read it; check the path");
    std::stringstream text;
    text << in.rdbuf();
    p.cfg.defaults = text.str();
    p.cfg.defaults_source = "--defaults " + o.defaults;
  }
  if (!p.cfg.defaults.empty()) {
    if (o.serve)
      throw Error(p.cfg.defaults_source + ": defaults apply to tandem run's batch lines; tandem serve takes each "
                  "request's body as sent: remove them");
    p.defaults = std::make_shared<const router::BodyDefaults>(router::BodyDefaults::parse(p.cfg.defaults, p.cfg.defaults_source));
  }
  p.model = runtime::ModelConfig::load(p.cfg.model.path);
  p.model.load_as = p.cfg.model.dtype;
  p.model.cpu_matmul = p.cfg.model.cpu_matmul;
  p.model.gpu_matmul = p.cfg.model.gpu_matmul;
  p.tokenizer = runtime::Tokenizer::load(p.cfg.model.path);
  p.max_model_len = p.cfg.model.max_model_len > 0 ? std::min(p.cfg.model.max_model_len, p.model.max_position_embeddings)
                                                  : p.model.max_position_embeddings;
  // A request's line is its prompt as JSON: even escaped (\uXXXX) or as token ids, a token rarely
  // takes more than a few dozen bytes, so 64 per context token bounds any line that can run.
  p.max_line_bytes = p.cfg.job.max_line_bytes > 0 ? p.cfg.job.max_line_bytes
                                                   : std::max<int64_t>(int64_t{1} << 20, 64 * p.max_model_len);
  return p;
}

runtime::EngineOptions engine_options(const Prepared& p) {
  return {p.cfg.job.max_num_seqs, p.cfg.job.max_batched_tokens, p.max_model_len};
}


// How prompts are built and outputs named, the same for run and serve.
void prompt_and_output_contexts(const Prepared& p, std::unique_ptr<runtime::ChatTemplate>& chat,
                                router::PromptContext& prompts, router::OutputContext& outputs) {
  prompts.tokenizer = p.tokenizer.get();
  try {
    chat = std::make_unique<runtime::ChatTemplate>(
        runtime::ChatTemplate::select(p.cfg.model.chat_template, p.tokenizer->config(), p.cfg.model.path + "/tokenizer_config.json"));
  } catch (const Error& e) {
    prompts.chat_error = e.what();  // completions still run; chat requests get this as their error
  }
  prompts.chat = chat.get();
  prompts.max_model_len = p.max_model_len;
  prompts.vocab_size = static_cast<int32_t>(p.model.vocab);
  prompts.hidden = p.model.hidden;
  outputs.served_name = p.cfg.model.served_name.empty() ? std::filesystem::path(p.cfg.model.path).filename().string()
                                                        : p.cfg.model.served_name;
  if (outputs.served_name.empty()) outputs.served_name = std::filesystem::path(p.cfg.model.path).parent_path().filename().string();
  outputs.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  outputs.tokenizer = p.tokenizer.get();
}

router::BatchSetup router_setup(const Prepared& p, std::unique_ptr<runtime::ChatTemplate>& chat) {
  router::BatchSetup s;
  const Config& c = p.cfg;
  s.input = c.job.input;
  s.output = c.job.output;
  s.summary = c.job.summary;
  s.pooling = router::pooling_or_error(c.model.path);
  s.hidden = p.model.hidden;
  s.defaults = p.defaults;
  s.progress_file = c.job.progress_file == "none" ? std::string() : c.job.progress_file;
  s.max_line_bytes = p.max_line_bytes;
  prompt_and_output_contexts(p, chat, s.prompts, s.outputs);
  s.window_per_worker = 2 * c.job.max_num_seqs;
  s.input_order = c.choices.output_order == OutputOrder::kInput;
  s.kernels = !c.choices.on_cpu()              ? c.model.backend
              : c.model.cpu_matmul == "bf16" ? std::string("avx512-bf16")
              : c.model.cpu_matmul == "bf16-amx"
                  ? std::string(runtime::cpu::amx_bf16_kernels() ? "amx-bf16" : "avx512-bf16amx")
              : c.model.cpu_matmul == "int8"
                  ? std::string(runtime::cpu::avx512_amx_kernels() ? "amx-int8" : "avx512-vnni")
                                             : std::string(runtime::cpu::kernels().name);
  s.flush_seconds = c.job.flush_seconds;
  s.progress_seconds = c.job.progress_seconds;
  s.drain_seconds = c.job.drain_seconds;
  s.reorder_window = c.router.reorder_window;
  // A helper costs about 1.4 times the main thread's CPU per line (perf/router_bench):
  // it pays from two helpers on, so from three CPUs.
  const int cpus = runtime::cpu::ThreadPool::available_cpus();
  s.tokenize_threads = c.router.tokenize_threads >= 0 ? static_cast<int>(c.router.tokenize_threads)
                       : cpus >= 3                    ? std::min(cpus - 1, 8)
                                                      : 0;
  s.job_seed = static_cast<uint64_t>(c.job.seed);
  s.resume = c.job.resume;
  s.scan = p.input_scan;
  s.scanned = true;  // check_files ran it
  const auto slurm_env = slurm::SlurmEnv::from_environment();
  s.shard_index = slurm_env.shard_index();
  s.shard_count = slurm_env.shard_count();
  s.array_task = slurm_env.array_task_id;
  router::DispatchOptions& d = s.dispatch;
  d.block_size = c.kv.block_size;
  d.policy = router::parse_route_policy(c.router.policy);
  d.weights = {1.0, 1.0, c.router.overlap_weight_device, c.router.overlap_weight_host, c.router.overlap_weight_disk,
               c.router.kv_between_nodes_weight};
  d.local_prefill_tokens = c.router.local_prefill_tokens;
  d.prefill_saturation_tokens = router::default_prefill_saturation(c.job.max_batched_tokens);
  return s;
}

// The tiers under a worker's pool (kv.host_cache_gib, kv.store_path), or
// null. Problems with the store are warnings (the job runs colder, never
// stops); the first worker logs them, the others at debug level.
std::unique_ptr<kv::KvTiers> open_tiers(const Prepared& p, const kv::KvLayout& layout, bool first_worker,
                                        bool blocks_on_host) {
  const auto& kvc = p.cfg.kv;
  if (kvc.host_cache_gib <= 0 && kvc.store_path.empty()) return nullptr;
  kv::TierOptions t;
  t.host_bytes = static_cast<int64_t>(kvc.host_cache_gib * static_cast<double>(1 << 30));
  t.store_min_hits = kvc.store_min_hits;
  if (!blocks_on_host) t.pool_copy = runtime::pool_copy(p.cfg.model.backend);  // a device pool is reached by copies
  if (!kvc.store_path.empty()) {
    t.store.dir = kvc.store_path;
    std::error_code ec;
    std::filesystem::create_directories(kvc.store_path, ec);  // for the cache below; the store says what is wrong
    // Each weight file's hash is cached in the store (read once for every later job on the same files).
    t.store.id = {runtime::model_fingerprint(p.cfg.model.path, p.model, std::filesystem::path(kvc.store_path) / "weight-hashes.json"),
                  p.model.architecture + " at " + p.cfg.model.path,
                  layout};
    t.store.max_bytes = static_cast<int64_t>(kvc.store_max_gib * static_cast<double>(1 << 30));
  }
  std::vector<std::string> warnings;
  auto tiers = std::make_unique<kv::KvTiers>(layout, t, warnings);
  for (const auto& w : warnings) {
    if (first_worker) spdlog::warn("{}", w);
    else spdlog::debug("{}", w);
  }
  const auto s = tiers->stats();
  if (first_worker) {
    std::string store = "off";
    if (s.store_enabled)
      store = kvc.store_path + " (" + std::to_string(s.store_blocks_at_open) + " blocks in " +
              std::to_string(s.store_files_at_open) + " files" + (s.store_writable ? "" : ", read-only") + ")";
    spdlog::info("KV tiers: host memory {} blocks ({:.2f} GiB), disk store {}", s.host_capacity_blocks,
                 static_cast<double>(s.host_capacity_blocks) * static_cast<double>(layout.block_bytes()) / (1 << 30),
                 store);
  }
  return tiers;
}

static void log_summary(const nlohmann::json& s) {
  // A resumed run counts this run's requests; the lines done by earlier runs are named too.
  const int64_t resumed = s.value("requests_resumed", int64_t{0});
  spdlog::info("done: {} ok, {} failed in {:.1f} s{}; {:.1f} output tok/s; TTFT p50 {:.0f} ms, ITL p50 {:.1f} ms",
               s["requests_ok"].get<int64_t>(), s["requests_failed"].get<int64_t>(), s["elapsed_s"].get<double>(),
               resumed > 0 ? " (and " + std::to_string(resumed) + " done by earlier runs, skipped)" : std::string(),
               s["output_tokens_per_s"].get<double>(), s["ttft_ms"]["p50"].get<double>(),
               s["itl_ms"]["p50"].get<double>());
}

// The end of a batch job on rank 0: the summary logged; the exit code (2
// when the input could not be read to its end: what was read is done and
// committed, and --resume goes on once the file is fixed).
int finish_run(const nlohmann::json& summary) {
  log_summary(summary);
  if (!summary.contains("input_error")) return 0;
  std::fprintf(stderr, "tandem: error: %s\n", summary["input_error"].get<std::string>().c_str());
  return 2;
}

// The planner of a job with job.mode = "auto", on rank 0: a roofline profile
// of this CPU measured now (then fitted to the steps the workers report) and
// the model's shape (weights in their dtype, KV in kv.dtype).
std::unique_ptr<planner::EpochPlanner> make_epoch_planner(const Prepared& p, int workers, int local_workers,
                                                          const std::string& gpu_name, int tp, int prefill_tp) {
  const int threads_each = p.cfg.cluster.threads_per_rank > 0
                               ? static_cast<int>(p.cfg.cluster.threads_per_rank)
                               : std::max(1, runtime::cpu::ThreadPool::available_cpus() / local_workers);
  // A worker of tp ranks: the planner's model of it is the group's (its exchanges included).
  runtime::DType held = p.model.dtype;  // model.dtype f32 / bf16 / f16 converts every matrix
  if (runtime::DType as; runtime::parse_dtype(p.model.load_as, as) && runtime::dtype_size(as) > 1) held = as;
  const auto whole = planner::ModelShape::from(p.model, static_cast<double>(runtime::dtype_size(held)),
                                               kv_layout(p).bytes_per_value());
  auto shape = whole.at_width(tp);
  shape.expert_parallel = p.cfg.cluster.expert_parallel;
  // With GPU workers rank 0 does not touch a GPU (it may have none): the CPU profile is only the
  // planner's first guess there, until the workers' reported steps replace it.
  const double pool_bytes = !p.cfg.choices.on_cpu() ? 0.0
                            : static_cast<double>(pool_blocks(p, local_workers)) * p.cfg.kv.block_size *
                                  shape.kv_bytes_per_token;
  planner::HardwareProfile hw;
  const std::string builtin = planner::HardwareProfile::builtin_for_device(gpu_name);
  if (!p.cfg.choices.on_cpu() && !builtin.empty()) {
    hw = planner::HardwareProfile::named(builtin);
    spdlog::info("planner: GPU workers ({}): the built-in {} profile, {:.0f} TFLOP/s and {:.0f} GB/s; policy {}",
                 gpu_name, builtin, hw.peak_flops / 1e12, hw.hbm_bytes_per_s / 1e9, p.cfg.planner.policy);
  } else {
    hw = planner::measure_cpu_profile(threads_each, shape.weight_bytes + pool_bytes);
    if (!p.cfg.choices.on_cpu())
      spdlog::warn("planner: no built-in profile for the workers' GPU ({}): this CPU's stands in until the workers' "
                   "steps calibrate it", gpu_name.empty() ? "unknown" : gpu_name);
    spdlog::info("planner: this CPU measures {:.0f} GFLOP/s and {:.1f} GB/s per worker ({} threads); policy {}",
                 hw.peak_flops / 1e9, hw.hbm_bytes_per_s / 1e9, threads_each, p.cfg.planner.policy);
  }
  planner::SimOptions so;
  so.workers = workers;
  so.max_num_seqs = p.cfg.job.max_num_seqs;
  so.max_batched_tokens = p.cfg.job.max_batched_tokens;
  so.epoch_requests = p.cfg.job.epoch_requests;
  so.local_prefill_tokens = p.cfg.router.local_prefill_tokens;
  so.block_size = p.cfg.kv.block_size;
  so.ttft_target_s = p.cfg.planner.ttft_ms / 1e3;
  so.itl_target_s = p.cfg.planner.itl_ms / 1e3;
  // Each width's model knows its width, so the steps a worker reports (with its width) fit the right one; with
  // two widths `workers` counts cells of lcm(prefill_tp, tp) ranks.
  return std::make_unique<planner::EpochPlanner>(so, whole, prefill_tp > 0 ? prefill_tp : tp, tp, hw, p.cfg.planner.policy);
}

// One verdict for every rank: the lowest failing rank's line, printed once by rank 0.
bool agreed(const mpi::MpiEnv& env, const std::string& error) {
  const std::string verdict = env.size() > 1 ? mpi::first_error(env.world(), error) : error;
  if (verdict.empty()) return true;
  if (env.rank() == 0) std::fprintf(stderr, "tandem: error: %s\n", verdict.c_str());
  return false;
}

}  // namespace tandem::launcher
