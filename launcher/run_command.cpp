// `tandem run`: the batch job. Under mpirun/srun, rank 0 routes and the
// other ranks run engines; with one rank, router and engine share the process.
#include <sys/sysinfo.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/log.h"
#include "launcher/commands.h"
#include "launcher/run/router_loop.h"
#include "launcher/run/worker_core.h"
#include "mpi_transport/mpi_env.h"
#include "runtime/model/weights.h"
#include "runtime/tokenizer/chat_template.h"

namespace tandem::launcher {
namespace {

struct RunOptions {
  ConfigOptions config;
  std::string model, input, output;
};

// Everything a rank needs to start, checked before any rank starts work.
struct Prepared {
  Config cfg;
  runtime::ModelConfig model;
  std::unique_ptr<runtime::Tokenizer> tokenizer;
  int64_t max_model_len = 0;
};

Prepared prepare(const RunOptions& o) {
  Prepared p;
  p.cfg = o.config.load();
  if (!o.model.empty()) p.cfg.model.path = o.model;
  if (!o.input.empty()) p.cfg.job.input = o.input;
  if (!o.output.empty()) p.cfg.job.output = o.output;
  if (p.cfg.model.path.empty()) throw Error("no model: set model.path in the job file or pass --model DIR");
  if (p.cfg.job.input.empty()) throw Error("no input: set job.input in the job file or pass --input FILE");
  if (p.cfg.job.output.empty()) throw Error("no output: set job.output in the job file or pass --output FILE");
  if (p.cfg.job.summary.empty()) p.cfg.job.summary = p.cfg.job.output + ".summary.json";
  if (p.cfg.model.backend != "cpu")
    throw Error("model.backend = \"" + p.cfg.model.backend + "\" is not available yet; use \"cpu\"");
  p.model = runtime::ModelConfig::load(p.cfg.model.path);
  p.tokenizer = runtime::Tokenizer::load(p.cfg.model.path);
  p.max_model_len = p.cfg.model.max_model_len > 0 ? std::min(p.cfg.model.max_model_len, p.model.max_position_embeddings)
                                                  : p.model.max_position_embeddings;
  return p;
}

// Rank 0's checks of what only it touches: input, output, summary, and that the weights map.
void check_files(const Prepared& p) {
  if (!std::ifstream(p.cfg.job.input))
    throw Error(p.cfg.job.input + ": cannot read the input (" + std::strerror(errno) + "); check job.input or --input");
  for (const auto& path : {p.cfg.job.output, p.cfg.job.summary}) {
    std::ofstream f(path, std::ios::app);
    if (!f) throw Error(path + ": cannot write here (" + std::strerror(errno) + "); check the path and permissions");
  }
  runtime::ModelWeights::load(p.model, p.cfg.model.path);  // maps and shape-checks; reads no weights
}

// KV blocks for one worker: kv.memory_gib, or room for max_num_seqs full contexts,
// capped at 60% of the memory this node's ranks could share.
int64_t pool_blocks(const Prepared& p, int local_ranks) {
  const kv::KvLayout layout{p.model.layers, p.model.kv_heads, p.model.head_dim, p.cfg.kv.block_size};
  const double block = static_cast<double>(layout.block_bytes());
  if (p.cfg.kv.memory_gib > 0) return std::max<int64_t>(1, static_cast<int64_t>(p.cfg.kv.memory_gib * (1 << 30) / block));
  const int64_t want = p.cfg.job.max_num_seqs * ((p.max_model_len + p.cfg.kv.block_size - 1) / p.cfg.kv.block_size);
  struct sysinfo si {};
  sysinfo(&si);
  const double avail = static_cast<double>(si.freeram + si.bufferram) * si.mem_unit * 0.6 / std::max(1, local_ranks);
  return std::max<int64_t>(1, std::min<int64_t>(want, static_cast<int64_t>(avail / block)));
}

runtime::EngineOptions engine_options(const Prepared& p) {
  return {p.cfg.job.max_num_seqs, p.cfg.job.max_batched_tokens, p.max_model_len};
}

router::RankReport router_report() {
  router::RankReport r;
  r.rank = 0;
  r.role = "router";
  return r;
}

RouterSetup router_setup(const Prepared& p, std::unique_ptr<runtime::ChatTemplate>& chat) {
  RouterSetup s;
  s.config = &p.cfg;
  s.input = p.cfg.job.input;
  s.output = p.cfg.job.output;
  s.summary = p.cfg.job.summary;
  s.prompts.tokenizer = p.tokenizer.get();
  try {
    chat = std::make_unique<runtime::ChatTemplate>(
        runtime::ChatTemplate::select(p.cfg.model.chat_template, p.tokenizer->config(), p.cfg.model.path + "/tokenizer_config.json"));
  } catch (const Error& e) {
    s.prompts.chat_error = e.what();  // completions still run; chat lines get this as their error
  }
  s.prompts.chat = chat.get();
  s.prompts.max_model_len = p.max_model_len;
  s.prompts.vocab_size = static_cast<int32_t>(p.model.vocab);
  s.outputs.served_name = p.cfg.model.served_name.empty() ? std::filesystem::path(p.cfg.model.path).filename().string()
                                                          : p.cfg.model.served_name;
  if (s.outputs.served_name.empty()) s.outputs.served_name = std::filesystem::path(p.cfg.model.path).parent_path().filename().string();
  s.outputs.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  s.outputs.tokenizer = p.tokenizer.get();
  s.window_per_worker = 2 * p.cfg.job.max_num_seqs;
  return s;
}

void log_summary(const nlohmann::json& s) {
  spdlog::info("done: {} ok, {} failed in {:.1f} s; {:.1f} output tok/s; TTFT p50 {:.0f} ms, ITL p50 {:.1f} ms",
               s["requests_ok"].get<int64_t>(), s["requests_failed"].get<int64_t>(), s["elapsed_s"].get<double>(),
               s["output_tokens_per_s"].get<double>(), s["ttft_ms"]["p50"].get<double>(),
               s["itl_ms"]["p50"].get<double>());
}

// -np 1: the router steps an engine in this process.
class InProcessLink : public WorkerLink {
 public:
  explicit InProcessLink(WorkerCore& core) : core_(core) {}
  std::vector<int> workers() const override { return {0}; }
  void submit(int, const WireRequest& r) override { core_.submit(r); }
  void poll(std::vector<WireResult>& results) override {
    if (core_.has_work()) {
      auto r = core_.step();
      results.insert(results.end(), std::make_move_iterator(r.begin()), std::make_move_iterator(r.end()));
    }
  }
  std::vector<router::RankReport> shutdown() override { return {core_.report()}; }

 private:
  WorkerCore& core_;
};

// Rank 0 under MPI: requests and results are messages.
class MpiLink : public WorkerLink {
 public:
  MpiLink(mpi::Mailbox& box, int size) : box_(box) {
    for (int r = 1; r < size; ++r) workers_.push_back(r);
  }
  std::vector<int> workers() const override { return workers_; }
  void submit(int worker, const WireRequest& r) override { check(box_.send(worker, mpi::kTagRequest, encode(r))); }
  void poll(std::vector<WireResult>& results) override {
    check(box_.progress());
    bool any = false;
    for (;;) {
      std::optional<mpi::Message> m;
      check(box_.try_recv(m, MPI_ANY_SOURCE, mpi::kTagResult));
      if (!m) break;
      results.push_back(decode_result(m->bytes));
      any = true;
    }
    if (any) backoff_.reset();
    else backoff_.idle();
  }
  std::vector<router::RankReport> shutdown() override {
    for (int w : workers_) check(box_.send(w, mpi::kTagShutdown, {}));
    std::vector<router::RankReport> reports{router_report()};
    while (reports.size() < workers_.size() + 1) {
      std::optional<mpi::Message> m;
      check(box_.try_recv(m, MPI_ANY_SOURCE, mpi::kTagReport));
      if (m) reports.push_back(decode_report(m->bytes));
      else backoff_.idle();
    }
    check(box_.flush());
    return reports;
  }

 private:
  static void check(const Status& s) {
    if (!s.ok()) throw Error(s.to_string());
  }
  mpi::Mailbox& box_;
  std::vector<int> workers_;
  mpi::Backoff backoff_;
};

// A worker rank under MPI: run what rank 0 sends until it says stop.
void worker_loop(mpi::Mailbox& box, WorkerCore& core) {
  auto check = [](const Status& s) {
    if (!s.ok()) throw Error(s.to_string());
  };
  mpi::Backoff backoff;
  bool stopping = false;
  for (;;) {
    bool any = false;
    for (;;) {
      std::optional<mpi::Message> m;
      check(box.try_recv(m, 0));
      if (!m) break;
      any = true;
      if (m->tag == mpi::kTagRequest) core.submit(decode_request(m->bytes));
      else if (m->tag == mpi::kTagShutdown) stopping = true;
    }
    if (core.has_work()) {
      for (auto& r : core.step()) check(box.send(0, mpi::kTagResult, encode(r)));
      any = true;
    }
    check(box.progress());
    if (stopping && !core.has_work()) break;
    if (any) backoff.reset();
    else backoff.idle();
  }
  check(box.send(0, mpi::kTagReport, encode(core.report())));
  check(box.flush());
}

// Rank 0 decides whether the job can start; every rank learns the verdict.
bool agree_to_start(const mpi::MpiEnv& env, std::string& error) {
  int len = static_cast<int>(error.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, env.world());
  if (len == 0) return true;
  error.resize(static_cast<std::size_t>(len));
  MPI_Bcast(error.data(), len, MPI_CHAR, 0, env.world());
  return false;
}

int run_job(const RunOptions& o, int argc, char** argv) {
  mpi::MpiEnv env(&argc, &argv);
  const int rank = env.rank();
  std::string error;
  Prepared p;
  try {
    p = prepare(o);
    log::init(p.cfg.log.level);
    log::set_identity(rank, rank == 0 ? (env.size() == 1 ? "router+worker" : "router") : "worker");
    if (rank == 0) check_files(p);
  } catch (const Error& e) {
    error = e.what();
  }
  if (env.size() > 1) {
    // Every rank has checked its config the same way; rank 0 also checked the files.
    int bad = error.empty() ? 0 : 1, any_bad = 0;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, env.world());
    std::string verdict = rank == 0 ? error : std::string();
    if (any_bad && verdict.empty() && rank == 0) verdict = "a worker could not read the job configuration";
    if (!agree_to_start(env, verdict)) {
      if (rank == 0) std::fprintf(stderr, "tandem: error: %s\n", verdict.c_str());
      return 2;
    }
  } else if (!error.empty()) {
    std::fprintf(stderr, "tandem: error: %s\n", error.c_str());
    return 2;
  }
  if (rank == 0) {
    spdlog::info("tandem run: {} rank(s); model {} ({}), input {}, output {}", env.size(), p.cfg.model.path,
                 p.model.architecture, p.cfg.job.input, p.cfg.job.output);
    log_effective_config(p.cfg);
  }

  // Workers: weights, KV pool, threads.
  MPI_Comm local;
  MPI_Comm_split_type(env.world(), MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  int local_size = 1;
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  const int local_workers = env.size() == 1 ? 1 : std::max(1, local_size - (rank == 0 ? 0 : 0) - 1);
  std::unique_ptr<runtime::ModelWeights> weights;
  std::unique_ptr<kv::BlockPool> pool;
  std::unique_ptr<runtime::cpu::ThreadPool> threads;
  std::unique_ptr<WorkerCore> core;
  if (rank != 0 || env.size() == 1) {
    weights = runtime::ModelWeights::load(p.model, p.cfg.model.path);
    const int64_t blocks = pool_blocks(p, local_workers);
    pool = std::make_unique<kv::BlockPool>(
        kv::KvLayout{p.model.layers, p.model.kv_heads, p.model.head_dim, p.cfg.kv.block_size}, blocks);
    const int n_threads = p.cfg.cluster.threads_per_rank > 0
                              ? static_cast<int>(p.cfg.cluster.threads_per_rank)
                              : std::max(1, runtime::cpu::ThreadPool::available_cpus() / local_workers);
    threads = std::make_unique<runtime::cpu::ThreadPool>(n_threads);
    core = std::make_unique<WorkerCore>(rank, env.size() == 1 ? "worker" : "worker", p.model, *weights, *pool, *threads,
                                        p.tokenizer.get(), engine_options(p));
    spdlog::info("worker ready: {} KV blocks of {} tokens ({:.2f} GiB), {} threads, {} kernels", blocks,
                 p.cfg.kv.block_size, static_cast<double>(blocks) * static_cast<double>(pool->layout().block_bytes()) / (1 << 30),
                 n_threads, runtime::cpu::kernels().name);
  }

  try {
    if (env.size() == 1) {
      std::unique_ptr<runtime::ChatTemplate> chat;
      InProcessLink link(*core);
      const auto summary = run_router(router_setup(p, chat), link);
      log_summary(summary);
      return 0;
    }
    mpi::Mailbox box(env.world());
    if (rank == 0) {
      std::unique_ptr<runtime::ChatTemplate> chat;
      MpiLink link(box, env.size());
      const auto summary = run_router(router_setup(p, chat), link);
      log_summary(summary);
    } else {
      worker_loop(box, *core);
    }
    MPI_Barrier(env.world());
  } catch (const Error& e) {
    std::fprintf(stderr, "tandem: error: [rank %d] %s\n", rank, e.what());
    MPI_Abort(env.world(), 3);  // a job that lost a rank cannot finish; stop every rank now
  }
  return 0;
}

}  // namespace

Action add_run_command(CLI::App& root, int argc, char** argv) {
  auto* cmd = root.add_subcommand("run", "Run a batch job: OpenAI-Batch JSONL in, one output line per input line");
  auto o = std::make_shared<RunOptions>();
  o->config.add_to(cmd);
  cmd->add_option("--model", o->model, "Model directory (overrides model.path)");
  cmd->add_option("--input", o->input, "Input JSONL (overrides job.input)");
  cmd->add_option("--output", o->output, "Output JSONL, appended to (overrides job.output)");
  return [o, argc, argv]() { return run_job(*o, argc, argv); };
}

}  // namespace tandem::launcher
