// `tandem run`: the batch job. Under mpirun/srun, rank 0 routes and the
// other ranks run engines; with one rank, router and engine share the process.
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <csignal>
#include <deque>
#include <unordered_map>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/log.h"
#include "launcher/commands.h"
#include "launcher/version.h"
#include "launcher/run/device_binding.h"
#include "launcher/run/gpu_workers.h"
#include "launcher/run/job_checks.h"
#include "launcher/run/transport_setup.h"
#include "launcher/run/links.h"
#include "launcher/run/router_loop.h"
#include "runtime/service/worker_core.h"
#include "launcher/serve/serve.h"
#include "planner/epoch_planner.h"
#include "planner/machine.h"
#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_worker_port.h"
#include "runtime/service/worker_service.h"
#include "mpi_transport/transport_registry.h"
#include "runtime/engine/backend_registry.h"
#include "kv/tiers.h"
#include "runtime/model/fingerprint.h"
#include "runtime/model/weights.h"
#include "runtime/tokenizer/chat_template.h"
#include "slurm/resumable_output.h"
#include "slurm/slurm_env.h"

namespace tandem::launcher {
namespace {

struct RunOptions {
  ConfigOptions config;
  std::string model, input, output;
  bool resume = false;
  bool serve = false;  // tandem serve: HTTP on rank 0 instead of the input file
  std::string host;
  int64_t port = -1;
};

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
  }
  p.model = runtime::ModelConfig::load(p.cfg.model.path);
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
  outputs.served_name = p.cfg.model.served_name.empty() ? std::filesystem::path(p.cfg.model.path).filename().string()
                                                        : p.cfg.model.served_name;
  if (outputs.served_name.empty()) outputs.served_name = std::filesystem::path(p.cfg.model.path).parent_path().filename().string();
  outputs.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  outputs.tokenizer = p.tokenizer.get();
}

RouterSetup router_setup(const Prepared& p, std::unique_ptr<runtime::ChatTemplate>& chat) {
  RouterSetup s;
  s.config = &p.cfg;
  s.input = p.cfg.job.input;
  s.output = p.cfg.job.output;
  s.summary = p.cfg.job.summary;
  s.max_line_bytes = p.max_line_bytes;
  prompt_and_output_contexts(p, chat, s.prompts, s.outputs);
  s.window_per_worker = 2 * p.cfg.job.max_num_seqs;
  s.resume = p.cfg.job.resume;
  const auto slurm_env = slurm::SlurmEnv::from_environment();
  s.shard_index = slurm_env.shard_index();
  s.shard_count = slurm_env.shard_count();
  s.array_task = slurm_env.array_task_id;
  s.block_size = p.cfg.kv.block_size;
  s.route_policy = p.cfg.router.policy;
  s.overlap_weight = p.cfg.router.overlap_weight_device;
  s.overlap_weight_host = p.cfg.router.overlap_weight_host;
  s.overlap_weight_disk = p.cfg.router.overlap_weight_disk;
  return s;
}

// The tiers under a worker's pool (kv.host_cache_gib, kv.store_path), or
// null. Problems with the store are warnings (the job runs colder, never
// stops); the first worker logs them, the others at debug level.
std::unique_ptr<kv::KvTiers> open_tiers(const Prepared& p, const kv::KvLayout& layout, bool first_worker) {
  const auto& kvc = p.cfg.kv;
  if (kvc.host_cache_gib <= 0 && kvc.store_path.empty()) return nullptr;
  kv::TierOptions t;
  t.host_bytes = static_cast<int64_t>(kvc.host_cache_gib * static_cast<double>(1 << 30));
  t.store_min_hits = kvc.store_min_hits;
  t.pool_copy = runtime::pool_copy(p.cfg.model.backend);  // a device pool is reached by copies
  if (!kvc.store_path.empty()) {
    t.store.dir = kvc.store_path;
    t.store.id = {runtime::model_fingerprint(p.cfg.model.path, p.model), p.model.architecture + " at " + p.cfg.model.path,
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

void log_summary(const nlohmann::json& s) {
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

// Rank 0 decides whether the job can start; every rank learns the verdict.
// The error of the lowest rank that has one ("" when none has), on every
// rank; another rank's is prefixed with its number.
std::string first_error(const mpi::MpiEnv& env, const std::string& error) {
  int mine = error.empty() ? INT_MAX : env.rank(), first = INT_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, env.world());
  if (first == INT_MAX) return "";
  int len = env.rank() == first ? static_cast<int>(error.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, env.world());
  std::string verdict = env.rank() == first ? error : std::string(static_cast<std::size_t>(len), '\0');
  MPI_Bcast(verdict.data(), len, MPI_CHAR, first, env.world());
  return first == 0 ? verdict : "rank " + std::to_string(first) + ": " + verdict;
}

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

// The planner of a job with job.mode = "auto", on rank 0: a roofline profile
// of this CPU measured now (then fitted to the steps the workers report) and
// the model's shape (weights in their dtype, KV in kv.dtype).
std::unique_ptr<planner::EpochPlanner> make_epoch_planner(const Prepared& p, int workers, int local_workers,
                                                          const std::string& gpu_name) {
  const int threads_each = p.cfg.cluster.threads_per_rank > 0
                               ? static_cast<int>(p.cfg.cluster.threads_per_rank)
                               : std::max(1, runtime::cpu::ThreadPool::available_cpus() / local_workers);
  const auto shape = planner::ModelShape::from(p.model, static_cast<double>(runtime::dtype_size(p.model.dtype)),
                                               static_cast<double>(kv_layout(p).elem_bytes));
  // With GPU workers rank 0 does not touch a GPU (it may have none): the CPU profile is only the
  // planner's first guess there, until the workers' reported steps replace it.
  const double pool_bytes = p.cfg.model.backend != "cpu" ? 0.0
                            : static_cast<double>(pool_blocks(p, local_workers)) * p.cfg.kv.block_size *
                                  shape.kv_bytes_per_token;
  planner::HardwareProfile hw;
  const std::string builtin = planner::HardwareProfile::builtin_for_device(gpu_name);
  if (p.cfg.model.backend != "cpu" && !builtin.empty()) {
    hw = planner::HardwareProfile::named(builtin);
    spdlog::info("planner: GPU workers ({}): the built-in {} profile, {:.0f} TFLOP/s and {:.0f} GB/s; policy {}",
                 gpu_name, builtin, hw.peak_flops / 1e12, hw.hbm_bytes_per_s / 1e9, p.cfg.planner.policy);
  } else {
    hw = planner::measure_cpu_profile(threads_each, shape.weight_bytes + pool_bytes);
    if (p.cfg.model.backend != "cpu")
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
  return std::make_unique<planner::EpochPlanner>(so, shape, hw, p.cfg.planner.policy);
}

extern "C" void on_interrupt(int sig) { g_stop_signal.store(sig); }

int run_job(const RunOptions& o, int argc, char** argv) {
  // USR1 and TERM (Slurm's warnings) are caught since main's first instruction (stop_signals.h).
  mpi::MpiEnv env(&argc, &argv);
  if (env.size() > 1) {  // every rank must speak the same protocol: a stale binary on one node stops the job here
    const std::string other = mpi::check_same_build(env.world(), service::kProtocolVersion, std::string("tandem ") + kVersion);
    if (!other.empty()) {
      if (env.rank() == 0) std::fprintf(stderr, "tandem: error: %s\n", other.c_str());
      return 2;
    }
  }
  // A client that hangs up, or an mpirun that is going away and closed our
  // stdout, is not our death: rank 0 still commits what it wrote.
  std::signal(SIGPIPE, SIG_IGN);
  if (o.serve) std::signal(SIGINT, on_interrupt);  // Ctrl-C in an interactive allocation drains too
  const int rank = env.rank();
  std::string error;
  Prepared p;
  std::unique_ptr<runtime::ChatTemplate> serve_chat;
  ServeSetup serve;
  FrontendPtr frontend;
  try {
    p = prepare(o);
    plan_roles(p.cfg, env.size());  // an impossible split stops every rank before work
    if (p.cfg.job.mode == "auto" && env.size() > 2) {  // so does a policy that cannot plan these workers
      if (p.cfg.planner.policy == "oracle")
        throw Error("planner.policy = \"oracle\" needs the simulator (tandem simulate); use lookahead, sla, agg or static:P:D");
      planner::make_policy(p.cfg.planner.policy, env.size() - 1);
    }
    log::init(p.cfg.log.level);
    log::set_identity(rank, rank == 0 ? (env.size() == 1 ? "router+worker" : "router") : "worker");
    if (rank == 0 && !o.serve) check_files(p);
    // Workers compute on model.backend: it must be built and have a device here.
    if (rank != 0 || env.size() == 1) check_backend(p, env.size());
    if (rank == 0 && o.serve) {
      runtime::ModelWeights::load(p.model, p.cfg.model.path, /*panels=*/false);  // maps and shape-checks
      serve.config = &p.cfg;
      prompt_and_output_contexts(p, serve_chat, serve.prompts, serve.outputs);
      serve.workers = std::max(1, env.size() - 1);
      frontend = bind_frontend(serve);  // a busy port stops the job here
    }
  } catch (const Error& e) {
    error = e.what();
  }
  if (env.size() > 1) {
    // Every rank has checked its config the same way; rank 0 also checked the
    // files, the workers their backend. The lowest failing rank's line is the verdict.
    const std::string verdict = first_error(env, error);
    if (!verdict.empty()) {
      if (rank == 0) std::fprintf(stderr, "tandem: error: %s\n", verdict.c_str());
      return 2;
    }
  } else if (!error.empty()) {
    std::fprintf(stderr, "tandem: error: %s\n", error.c_str());
    return 2;
  }
  if (rank == 0) {
    if (o.serve)
      spdlog::info("tandem serve: {} rank(s); model {} ({}) as '{}'", env.size(), p.cfg.model.path, p.model.architecture,
                   serve.outputs.served_name);
    else
      spdlog::info("tandem run: {} rank(s); model {} ({}), input {}, output {}", env.size(), p.cfg.model.path,
                   p.model.architecture, p.cfg.job.input, p.cfg.job.output);
    log_effective_config(p.cfg);
    try {
      spdlog::info("placement: {}", slurm::SlurmEnv::from_environment().describe());
    } catch (const Error& e) {
      spdlog::warn("placement: {}", e.what());
    }
  }

  // job.mode = "auto": roles may change between epochs, so KV must be able to move from the start.
  const bool planned = p.cfg.job.mode == "auto" && env.size() > 2;
  // Roles: rank 0 routes; workers 1..P prefill, the rest decode (agg: all do both).
  const Roles roles = plan_roles(p.cfg, env.size());
  const bool prefill_rank = rank >= 1 && rank <= roles.prefill;
  const std::string role = env.size() == 1 ? "router+worker" : rank == 0 ? "router" : roles.prefill == 0 ? "worker"
                           : prefill_rank ? "prefill" : "decode";
  log::set_identity(rank, role);
  // The workers' communicator never changes (KV windows live on it); the
  // prefill and decode communicators are split from it.
  MPI_Comm workers = MPI_COMM_NULL, role_comm = MPI_COMM_NULL;
  if (env.size() > 1) {
    MPI_Comm_split(env.world(), rank == 0 ? MPI_UNDEFINED : 0, rank, &workers);
    if (workers != MPI_COMM_NULL) MPI_Comm_split(workers, prefill_rank ? 1 : 0, rank, &role_comm);
  }
  if (rank == 0 && env.size() > 1) {
    if (planned) spdlog::info("job.mode = auto: the planner splits the {} worker rank(s) anew for each epoch", env.size() - 1);
    else if (roles.prefill > 0) spdlog::info("disaggregated: {} prefill rank(s), {} decode rank(s)", roles.prefill, roles.decode);
    else spdlog::info("aggregated: {} worker rank(s) prefill and decode", roles.decode);
  }

  // Workers: weights, KV pool (in a transport window when disaggregated), threads.
  MPI_Comm local;
  MPI_Comm_split_type(env.world(), MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  int local_size = 1, local_rank = 0;
  MPI_Comm_size(local, &local_size);
  MPI_Comm_rank(local, &local_rank);
  int router_here = rank == 0 ? 1 : 0;  // rank 0 routes on one node only: the others hold workers alone
  MPI_Allreduce(MPI_IN_PLACE, &router_here, 1, MPI_INT, MPI_MAX, local);
  const int local_workers = env.size() == 1 ? 1 : std::max(1, workers_on_node(local_size, router_here != 0));
  const std::string& backend = p.cfg.model.backend;
  std::string gpu_name;  // the workers' GPU (rank 0 learns it from rank 1)
  if (backend != "cpu") {
    // Each GPU worker binds its device now; two workers of a node on one GPU
    // (more workers than visible GPUs) stop every rank with one line.
    error = bind_worker_device(backend, rank, env.size(), local, local_rank, router_here != 0);
    if (env.size() > 1) error = first_error(env, error);
    if (error.empty() && env.size() > 1) gpu_name = first_worker_gpu(backend, rank, env.world());
    if (!error.empty()) {
      if (rank == 0) std::fprintf(stderr, "tandem: error: %s\n", error.c_str());
      MPI_Comm_free(&local);
      if (role_comm != MPI_COMM_NULL) MPI_Comm_free(&role_comm);
      if (workers != MPI_COMM_NULL) MPI_Comm_free(&workers);
      return 2;
    }
  }
  MPI_Comm_free(&local);
  std::unique_ptr<runtime::ModelWeights> weights;
  std::unique_ptr<mpi::KvTransport> transport;
  std::unique_ptr<kv::BlockPool> pool;
  std::unique_ptr<runtime::cpu::ThreadPool> threads;
  std::unique_ptr<kv::KvTiers> tiers;
  std::unique_ptr<service::WorkerCore> core;
  std::shared_ptr<void> device_pool;  // the KV pool's device memory (non-CPU backends, no transport)
  // The workers load in three phases, every rank learning after each whether
  // any worker failed: a worker that failed alone would otherwise leave the
  // others in the transport's collective calls and rank 0 waiting for it to
  // report loaded, a job hung without a word. On failure the lowest failing
  // rank's line is printed once and every rank returns.
  const bool worker = rank != 0 || env.size() == 1;
  std::string failed;
  auto phase = [&](const char* out_of_memory, auto&& work) {
    if (worker && failed.empty()) failed = setup_error(work, out_of_memory);
    if (env.size() > 1) failed = first_error(env, failed);
    return failed.empty();
  };
  int64_t blocks = 0;
  const kv::KvLayout layout = kv_layout(p);
  phase("out of memory loading the model's weights; run fewer ranks per node (cluster.threads_per_rank gives each "
        "more cores)", [&] {
    weights = runtime::ModelWeights::load(p.model, p.cfg.model.path, runtime::backend_wants_panels(backend));
    blocks = pool_blocks(p, local_workers);
  }) && phase("out of memory allocating the KV pool; lower kv.memory_gib (0 sizes it from the memory left)", [&] {
    if (roles.prefill > 0 || planned) {
      void* base = nullptr;
      const std::string t = transport_for(backend, p.cfg.transport.backend);
      transport = open_transport(t, workers, layout.block_bytes(), blocks, &base,
                                 t == "nccl" ? mpi::DevicePool{} : staging_pool(backend));
      pool = std::make_unique<kv::BlockPool>(layout, blocks, static_cast<float*>(base));
    } else if (backend != "cpu") {
      device_pool = runtime::allocate_pool_memory(backend, static_cast<std::size_t>(blocks) * layout.block_bytes());
      pool = std::make_unique<kv::BlockPool>(layout, blocks, static_cast<float*>(device_pool.get()));
    } else {
      pool = std::make_unique<kv::BlockPool>(layout, blocks);
    }
  }) && phase("out of memory setting up the engine and the KV tiers; lower kv.host_cache_gib or kv.memory_gib", [&] {
    const int n_threads = p.cfg.cluster.threads_per_rank > 0
                              ? static_cast<int>(p.cfg.cluster.threads_per_rank)
                              : std::max(1, runtime::cpu::ThreadPool::available_cpus() / local_workers);
    threads = std::make_unique<runtime::cpu::ThreadPool>(n_threads);
    tiers = open_tiers(p, layout, rank <= 1);
    if (tiers) pool->set_lower(tiers.get());
    runtime::EngineOptions options = engine_options(p);
    options.sampling_threads = threads.get();  // a step's draws, in parallel
    core = std::make_unique<service::WorkerCore>(rank, role == "router+worker" ? "worker" : role, p.model,
                                        runtime::make_backend(backend, p.model, *weights, *pool, *threads), *pool,
                                        p.tokenizer.get(), options, tiers.get());
    if (tiers && rank == 1) core->share_store_index();  // rank 0 learns the store's blocks once
    spdlog::info("worker ready: {} {} KV blocks of {} tokens ({:.2f} GiB{}), {} threads, {}", blocks,
                 layout.elem_bytes == 2 ? "bf16" : "f32", p.cfg.kv.block_size,
                 static_cast<double>(blocks) * static_cast<double>(layout.block_bytes()) / (1 << 30),
                 transport ? std::string(", ") + std::string(transport->name()) + " window" : std::string(), n_threads,
                 backend == "cpu" ? std::string(runtime::cpu::kernels().name) + " kernels" : "backend " + backend);
  });
  if (!failed.empty()) {
    if (rank == 0) std::fprintf(stderr, "tandem: error: %s\n", failed.c_str());
    core.reset();
    tiers.reset();
    pool.reset();
    if (transport) (void)transport->destroy();
    transport.reset();
    if (role_comm != MPI_COMM_NULL) MPI_Comm_free(&role_comm);
    if (workers != MPI_COMM_NULL) MPI_Comm_free(&workers);
    return 2;
  }

  int rc = 0;
  try {
    if (env.size() == 1) {
      std::unique_ptr<runtime::ChatTemplate> chat;
      InProcessLink link(*core);
      auto setup = router_setup(p, chat);
      if (o.serve) {
        serve.dispatch = dispatch_options(setup);
        return run_serve(serve, *frontend, link);
      }
      return finish_run(run_router(setup, link));
    }
    mpi::Mailbox box(env.world());
    if (rank == 0) {
      std::unique_ptr<runtime::ChatTemplate> chat;
      std::vector<int> decode, prefill;
      for (int r = 1; r < env.size(); ++r) (r <= roles.prefill ? prefill : decode).push_back(r);
      MpiLink link(box, decode, prefill);
      auto setup = router_setup(p, chat);
      setup.local_prefill_tokens = p.cfg.router.local_prefill_tokens;
      setup.prefill_saturation_tokens = router::default_prefill_saturation(p.cfg.job.max_batched_tokens);
      // job.mode = "auto": the planner re-splits the workers between epochs.
      std::unique_ptr<planner::EpochPlanner> epoch_planner;
      if (planned) {
        epoch_planner = make_epoch_planner(p, env.size() - 1, local_workers, gpu_name);
        std::vector<int> ranks;
        for (int r = 1; r < env.size(); ++r) ranks.push_back(r);
        setup.planner = epoch_planner.get();
        setup.epoch_requests = p.cfg.job.epoch_requests;
        setup.worker_ranks = ranks;
        serve.planner = epoch_planner.get();
        serve.epoch_seconds = p.cfg.job.epoch_seconds;
        serve.worker_ranks = ranks;
      }
      if (o.serve) {
        serve.dispatch = dispatch_options(setup);
        run_serve(serve, *frontend, link);
      } else {
        rc = finish_run(run_router(setup, link));
      }
    } else {
      // The worker service, reached by MPI; the port owns the role communicator from here on.
      mpi::MpiWorkerPort port(box, transport.get(), workers, std::exchange(role_comm, MPI_COMM_NULL));
      service::WorkerService worker_service(*core, port, [rank](const std::string& r) { log::set_identity(rank, r); });
      mpi::Backoff idle;
      while (!worker_service.finished()) {
        if (worker_service.tick()) idle.reset();
        else idle.idle();
      }
      worker_service.finish();
    }
    MPI_Barrier(env.world());
    if (transport) {
      if (Status st = transport->destroy(); !st.ok()) spdlog::warn("closing the KV window: {}", st.to_string());
    }
    if (role_comm != MPI_COMM_NULL) MPI_Comm_free(&role_comm);
    if (workers != MPI_COMM_NULL) MPI_Comm_free(&workers);
  } catch (const Error& e) {
    std::fprintf(stderr, "tandem: error: [rank %d] %s\n", rank, e.what());
    MPI_Abort(env.world(), 3);  // a job that lost a rank cannot finish; stop every rank now
  }
  return rc;
}

}  // namespace

Action add_run_command(CLI::App& root, int argc, char** argv) {
  auto* cmd = root.add_subcommand("run", "Run a batch job: OpenAI-Batch JSONL in, one output line per input line");
  auto o = std::make_shared<RunOptions>();
  o->config.add_to(cmd);
  cmd->add_option("--model", o->model, "Model directory (overrides model.path)");
  cmd->add_option("--input", o->input, "Input JSONL (overrides job.input)");
  cmd->add_option("--output", o->output, "Output JSONL, appended to (overrides job.output)");
  cmd->add_flag("--resume", o->resume,
                "Continue an existing output: skip what its checkpoint says is done (automatic on a Slurm requeue)");
  return [o, argc, argv]() { return run_job(*o, argc, argv); };
}

Action add_serve_command(CLI::App& root, int argc, char** argv) {
  auto* cmd = root.add_subcommand(
      "serve", "Serve the model over an OpenAI-compatible HTTP API on rank 0 (same job file and ranks as run)");
  auto o = std::make_shared<RunOptions>();
  o->serve = true;
  o->config.add_to(cmd);
  cmd->add_option("--model", o->model, "Model directory (overrides model.path)");
  cmd->add_option("--host", o->host, "Address to listen on (overrides http.host; default 127.0.0.1)");
  cmd->add_option("--port", o->port, "Port to listen on (overrides http.port; default 8000)")->check(CLI::Range(0, 65535));
  return [o, argc, argv]() { return run_job(*o, argc, argv); };
}

}  // namespace tandem::launcher
