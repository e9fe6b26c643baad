#include "launcher/run/job.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/log.h"
#include "launcher/run/device_binding.h"
#include "launcher/run/gpu_workers.h"
#include "launcher/run/job_setup.h"
#include "launcher/run/layout.h"
#include "launcher/run/worker_rank.h"
#include "launcher/run/transport_setup.h"
#include "launcher/serve/serve.h"
#include "launcher/stop_signals.h"
#include "router/hosts.h"
#include "launcher/version.h"
#include "mpi_transport/collectives.h"
#include "mpi_transport/comm.h"
#include "mpi_transport/mpi_check.h"
#include "mpi_transport/mpi_router_link.h"
#include "runtime/service/worker_service.h"
#include "mpi_transport/mpi_tp_group.h"
#include "mpi_transport/transport_registry.h"
#include "mpi_transport/mpi_worker_port.h"
#include "mpi_transport/quiesce.h"
#include "planner/policy.h"
#include "router/loop/in_process_link.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/model/weights.h"
#include "runtime/service/group_worker.h"
#include "runtime/service/worker_service.h"
#include "slurm/slurm_env.h"

namespace tandem::launcher {
namespace {

extern "C" void on_interrupt(int sig) { g_stop_signal.store(sig); }

// What every rank checked before any work, and rank 0's HTTP front end (serve).
struct Started {
  Prepared p;
  std::unique_ptr<runtime::ChatTemplate> serve_chat;
  ServeSetup serve;
  FrontendPtr frontend;
};

// This rank's share of the start-up checks: the config (every rank alike),
// rank 0's files (run) or port (serve), a worker's backend. Its error, or "".
std::string check_start(const mpi::MpiEnv& env, const RunOptions& o, Started& s) {
  const int rank = env.rank();
  try {
    s.p = prepare(o);
    const Prepared& p = s.p;
    const topology::Ask ask = split_ask(p.cfg);
    const topology::Roles roles = topology::plan_roles(ask, env.size());  // an impossible split stops every rank before work
    if (const std::string why = tp_problem(p, roles); !why.empty()) throw Error(why);  // so do widths
    if (topology::planned_job(ask, roles, env.size())) {  // and a policy that cannot plan these workers
      if (p.cfg.planner.policy == "oracle")
        throw Error("planner.policy = \"oracle\" needs the simulator (tandem simulate); use lookahead, sla, agg or static:P:D");
      if (const int cell = topology::cell_ranks(ask, roles, env.size()); cell == 0) {
        planner::make_policy(p.cfg.planner.policy, roles.workers());
      } else {  // two widths: the planner splits cells (a split's P and D count them)
        const int cells = (roles.ranks.prefill + roles.ranks.decode) / cell;
        try {
          planner::make_policy(p.cfg.planner.policy, cells);
        } catch (const Error& e) {
          throw Error(std::string(e.what()) + " (with two widths the planner splits cells of " + std::to_string(cell) +
                      " ranks, each running prefill or decode workers: this job has " + std::to_string(cells) + ")");
        }
      }
    }
    log::init(p.cfg.log.level);
    log::set_identity(rank, rank == 0 ? (env.size() == 1 ? "router+worker" : "router") : "worker");
    if (rank == 0 && !o.serve) check_files(s.p);
    // Workers compute on model.backend: it must be built and have a device here.
    if (rank != 0 || env.size() == 1) check_backend(p, env.size());
    if (rank == 0 && o.serve) {
      runtime::ModelWeights::check(p.model, p.cfg.model.path);  // maps and checks every tensor; reads no weights
      s.serve.config = &s.p.cfg;
      prompt_and_output_contexts(p, s.serve_chat, s.serve.prompts, s.serve.outputs);
      s.serve.workers = roles.workers();
      s.serve.pooling = router::pooling_or_error(p.cfg.model.path);
      s.serve.hidden = p.model.hidden;
      s.serve.max_line_bytes = p.max_line_bytes;
      s.frontend = bind_frontend(s.serve);  // a busy port stops the job here
    }
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

void log_start(const mpi::MpiEnv& env, const RunOptions& o, const Started& s) {
  const Prepared& p = s.p;
  if (o.serve)
    spdlog::info("tandem serve: {} rank(s); model {} ({}) as '{}'", env.size(), p.cfg.model.path, p.model.architecture,
                 s.serve.outputs.served_name);
  else
    spdlog::info("tandem run: {} rank(s); model {} ({}), input {}, output {}", env.size(), p.cfg.model.path,
                 p.model.architecture, p.cfg.job.input, p.cfg.job.output);
  log_effective_config(p.cfg);
  if (!env.launch_settings().empty())
    spdlog::info("started by srun: {} (a safe MPI start-up; docs/slurm.md)", fmt::join(env.launch_settings(), " "));
  try {
    spdlog::info("placement: {}", slurm::SlurmEnv::from_environment().describe());
  } catch (const Error& e) {
    spdlog::warn("placement: {}", e.what());
  }
}

// Rank 0's word on which node prefills and decodes where, and where the
// tensor-parallel workers sit, when there are several nodes.
void log_groups(const topology::Roles& r, const std::vector<std::string>& hosts, bool by_node) {
  using topology::Side;
  const topology::GroupMap& m = r.map();
  const bool one_rank_workers = r.width(Side::kPrefill) == 1 && r.width(Side::kDecode) == 1;
  const auto nodes = router::ranks_by_host(hosts);
  if (r.disaggregated() && nodes.size() > 1) {
    std::string line;
    for (const auto& [host, ranks] : nodes) {
      std::vector<int> pre, dec;
      for (int rank : ranks)
        if (rank > 0) (m.side_at(rank) == Side::kPrefill ? pre : dec).push_back(rank);
      if (pre.empty() && dec.empty()) continue;
      line += fmt::format("{}{} (", line.empty() ? "" : ", ", host);
      if (!pre.empty()) line += "prefill " + topology::GroupMap::describe(pre) + (dec.empty() ? "" : "; ");
      if (!dec.empty()) line += "decode " + topology::GroupMap::describe(dec);
      line += ")";
    }
    spdlog::info("roles by node{}: {}", by_node && one_rank_workers ? " (placed by node)" : "", line);
  }
  if (one_rank_workers) return;
  auto nodes_of = [&hosts](const std::vector<int>& group) {
    std::vector<std::string> on;
    for (int rank : group)
      if (const std::string& h = hosts[static_cast<std::size_t>(rank)]; std::find(on.begin(), on.end(), h) == on.end())
        on.push_back(h);
    return fmt::format("{}", fmt::join(on, ", "));
  };
  if (by_node) {
    std::string line;
    for (Side side : topology::kSides)
      for (int leader : m.leaders(side))
        line += fmt::format("{}{} ranks {} ({})", line.empty() ? "" : "; ",
                            side == Side::kPrefill ? "prefill" : r.disaggregated() ? "decode" : "worker",
                            topology::GroupMap::describe(m.members(leader)), nodes_of(m.members(leader)));
    spdlog::info("tensor-parallel workers placed by node: {}", line);
  }
  for (const auto& g : m.spanning(hosts))
    spdlog::warn("the tensor-parallel worker of ranks {} spans nodes ({}): its exchanges (two per layer) cross the "
                 "network, as no node has {} of this job's ranks left for it; give each node a multiple of {} tasks "
                 "(rank 0's node one more)",
                 topology::GroupMap::describe(g), nodes_of(g), g.size(), g.size());
}

Layout lay_out(const mpi::MpiEnv& env, const Prepared& p, const std::vector<std::string>& hosts) {
  using topology::Side;
  const int rank = env.rank();
  const topology::Ask ask = split_ask(p.cfg);
  topology::Roles roles = topology::plan_roles(ask, env.size());
  const bool planned = topology::planned_job(ask, roles, env.size());
  const int cell = topology::cell_ranks(ask, roles, env.size());
  bool by_node = false, keep_roles = true;
  if (env.size() > 2 && cell == 0) {  // cells keep rank order: their forms' groups are consecutive ranks
    // A heterogeneous Slurm job puts prefill and decode on the components asked for: roles keep their ranks.
    int keep = std::getenv("SLURM_HET_SIZE") != nullptr || p.cfg.choices.placement == Placement::kRank ? 1 : 0;
    TANDEM_MPI_OR_THROW(MPI_Bcast(&keep, 1, MPI_INT, 0, env.world()));
    keep_roles = keep != 0;
    topology::GroupMap placed = topology::place_by_node(hosts, roles.ranks.prefill, roles.width(Side::kPrefill),
                                                        roles.ranks.decode, roles.width(Side::kDecode), keep_roles);
    by_node = !(placed == roles.groups);
    roles.groups = std::move(placed);
  }
  Layout l;
  static_cast<topology::Place&>(l) = topology::place_of(rank, std::move(roles), planned, keep_roles, cell);
  log::set_identity(rank, env.size() == 1 ? "router+worker" : rank == 0 ? "router" : service::role_name(l.role()));
  if (env.size() > 1) {
    l.workers = mpi::split(env.world(), rank == 0 ? MPI_UNDEFINED : 0, rank);
    if (l.workers) {
      l.group_comm = mpi::split(l.workers.get(), l.roles.map().leader_of(rank), rank);  // its place: rank order
      if (l.regroups())  // the group of the cell's other form, split now, on every worker rank alike
        l.other_comm = mpi::split(l.workers.get(), l.other_leader(), rank);
    }
  }
  if (rank == 0 && env.size() > 1) {
    const topology::Roles& r = l.roles;
    auto workers = [](int ranks, int tp) {
      return tp == 1 ? std::to_string(ranks) + " rank(s)"
                     : std::to_string(ranks / tp) + " worker(s) of " + std::to_string(tp) + " ranks (tensor-parallel)";
    };
    const int pre = r.width(Side::kPrefill), dec = r.width(Side::kDecode);
    if (l.regroups())
      spdlog::info("job.mode = auto: the planner splits {} cells of {} ranks anew for each epoch, each running {} or {}",
                   (r.ranks.prefill + r.ranks.decode) / l.cell, l.cell, workers(l.cell, pre) + " to prefill",
                   workers(l.cell, dec) + " to decode");
    else if (l.planned)
      spdlog::info("job.mode = auto: the planner splits the {} anew for each epoch", workers(r.ranks.prefill + r.ranks.decode, dec));
    else if (r.disaggregated())
      spdlog::info("disaggregated: prefill on {}, decode on {}", workers(r.ranks.prefill, pre), workers(r.ranks.decode, dec));
    else spdlog::info("aggregated: {} prefill and decode", workers(r.ranks.decode, dec));
    log_groups(r, hosts, by_node);
  }
  return l;
}

// How many of this node's workers may run on a CPU this rank may run on
// (itself included): they split those CPUs between them. mpirun binds
// ranks to a core each (2 ranks), to a socket (more), or not at all; srun
// gives each task its own --cpus-per-task. Rank 0, which routes, is not
// counted. Collective over the node.
int cpu_sharers(MPI_Comm local, int world_rank, int local_size) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine);
  struct Entry {
    cpu_set_t cpus;
    int world_rank;
  };
  Entry me{mine, world_rank};
  std::vector<Entry> all(static_cast<std::size_t>(local_size));
  TANDEM_MPI_OR_THROW(MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, local));
  int sharers = 0;
  for (const Entry& e : all) {
    if (e.world_rank == 0 && world_rank != 0) continue;
    cpu_set_t both;
    CPU_AND(&both, &e.cpus, &mine);
    if (CPU_COUNT(&both) > 0) ++sharers;
  }
  return std::max(1, sharers);
}

// Which ranks run on which node, when there are several.
void log_nodes(const std::vector<std::string>& hosts) {
  const auto nodes = router::ranks_by_host(hosts);
  if (nodes.size() < 2) return;
  std::string line;
  for (const auto& [host, ranks] : nodes)
    line += fmt::format("{}{}: rank{} {}", line.empty() ? "" : "; ", host, ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
  spdlog::info("{} nodes: {}", nodes.size(), line);
}

std::string settle_node(const mpi::MpiEnv& env, const Prepared& p, Node& node) {
  const int rank = env.rank();
  mpi::Comm local = mpi::split_node(env.world(), rank);
  int local_size = 1, local_rank = 0;
  TANDEM_MPI_OR_THROW(MPI_Comm_size(local.get(), &local_size));
  TANDEM_MPI_OR_THROW(MPI_Comm_rank(local.get(), &local_rank));
  int router_here = rank == 0 ? 1 : 0;  // rank 0 routes on one node only: the others hold workers alone
  TANDEM_MPI_OR_THROW(MPI_Allreduce(MPI_IN_PLACE, &router_here, 1, MPI_INT, MPI_MAX, local.get()));
  node.local_workers = env.size() == 1 ? 1 : std::max(1, workers_on_node(local_size, router_here != 0));
  if (rank == 0) log_nodes(node.hosts);
  const std::string& backend = p.cfg.model.backend;
  if (p.cfg.choices.on_cpu()) {
    node.cpu_sharers = cpu_sharers(local.get(), rank, local_size);
    return "";
  }
  // Each GPU worker binds its device now; two workers of a node on one GPU
  // (more workers than visible GPUs) stop every rank with one line.
  std::string error = bind_worker_device(backend, rank, env.size(), local.get(), local_rank, router_here != 0);
  if (env.size() > 1) error = mpi::first_error(env.world(), error);
  if (error.empty() && env.size() > 1) node.gpu_name = first_worker_gpu(backend, rank, env.world());
  return error;
}

// -np 1: the router steps the engine in this process.
int run_single(const RunOptions& o, Started& s, const Layout& l, WorkerParts& w) {
  auto core = make_core(0, s.p, l, w, std::move(w.model));
  std::unique_ptr<runtime::ChatTemplate> chat;
  router::InProcessLink link(*core);
  auto setup = router_setup(s.p, chat);
  if (o.serve) {
    s.serve.dispatch = setup.dispatch;
    return run_serve(s.serve, *s.frontend, link);
  }
  return finish_run(router::run_batch(setup, link, &g_stop_signal));
}

// Rank 0 under MPI: the batch file or the HTTP front end, through MPI
// messages to each worker's leader.
int run_rank0(const RunOptions& o, Started& s, const Layout& l, const Node& node, mpi::Mailbox& box) {
  const Prepared& p = s.p;
  std::unique_ptr<runtime::ChatTemplate> chat;
  using topology::Side;
  const topology::Roles& r = l.roles;
  // Every change of roles goes through the cells: one per worker, or cells that regroup between widths.
  mpi::MpiLink link(box, topology::job_cells(r, l.cell),
                    {kv_layout(p, r.width(Side::kPrefill)).block_bytes(), kv_layout(p, r.width(Side::kDecode)).block_bytes()});
  auto setup = router_setup(p, chat);
  setup.hosts = node.hosts;
  setup.dispatch.node_of = router::node_numbers(node.hosts);  // a prefill prefers its decode worker's node
  setup.worker_timeout_seconds = p.cfg.job.worker_timeout_seconds;
  link.set_silence_limit(p.cfg.job.worker_timeout_seconds, node.hosts);
  // job.mode = "auto": the planner re-splits the workers between epochs.
  std::unique_ptr<planner::EpochPlanner> epoch_planner;
  if (l.planned) {
    std::vector<int> ranks;
    if (l.regroups()) {  // the planner splits cells; a cell that changes form regroups (router/regroups.h)
      epoch_planner = make_epoch_planner(p, (r.ranks.prefill + r.ranks.decode) / l.cell, node.local_workers,
                                         node.gpu_name, r.width(Side::kDecode), r.width(Side::kPrefill));
      ranks = link.regroups().keys();
    } else {
      epoch_planner = make_epoch_planner(p, r.workers(), node.local_workers, node.gpu_name, r.width(Side::kDecode));
      // The planner's re-splits prefill on the first k: in rank order, or spread over the nodes.
      ranks = r.leaders(Side::kPrefill);
      const std::vector<int> decode = r.leaders(Side::kDecode);
      ranks.insert(ranks.end(), decode.begin(), decode.end());
      if (!l.keep_roles) ranks = r.map().leaders_by_node(node.hosts);
    }
    setup.planner = epoch_planner.get();
    setup.epoch_requests = p.cfg.job.epoch_requests;
    setup.worker_ranks = ranks;
    s.serve.planner = epoch_planner.get();
    s.serve.epoch_seconds = p.cfg.job.epoch_seconds;
    s.serve.worker_ranks = ranks;
  }
  if (o.serve) {
    s.serve.dispatch = setup.dispatch;
    s.serve.worker_timeout_seconds = p.cfg.job.worker_timeout_seconds;
    return run_serve(s.serve, *s.frontend, link);
  }
  return finish_run(router::run_batch(setup, link, &g_stop_signal));
}

int run(mpi::MpiEnv& env, const RunOptions& o) {
  if (env.size() > 1) {  // every rank must speak the same protocol: a stale binary on one node stops the job here
    const std::string other = mpi::check_same_build(env.world(), service::kProtocolVersion, std::string("tandem ") + kVersion);
    if (!other.empty()) {
      if (env.rank() == 0) std::fprintf(stderr, "tandem: error: %s\n", other.c_str());
      return 2;
    }
  }
  Started s;
  if (!agreed(env, check_start(env, o, s))) return 2;
  if (env.rank() == 0) log_start(env, o, s);
  Node node;
  if (env.size() > 1) node.hosts = mpi::rank_hosts(env.world());
  Layout l = lay_out(env, s.p, node.hosts);
  if (!agreed(env, settle_node(env, s.p, node))) return 2;
  WorkerParts w;
  if (!load_worker(env, s.p, l, node, w)) return 2;
  if (env.size() == 1) return run_single(o, s, l, w);
  int rc = 0;
  {
    mpi::Mailbox box(env.world());
    if (env.rank() == 0) rc = run_rank0(o, s, l, node, box);
    else run_worker(env, s.p, l, w, box);
  }
  mpi::quiesce(env.world(), w.transport.get());  // every rank here before the transport closes
  return rc;  // the transport, then the communicators, close as their owners go, on every rank in the same order
}

// Every rank has passed the job's end: rank 0 writes its exit code to
// $TANDEM_EXIT_FILE when set, for a batch script that must tell a job step
// whose launcher outlives its tasks from one still running (jobs/disagg.sbatch).
void note_exit(int rc) {
  const char* path = std::getenv("TANDEM_EXIT_FILE");
  if (!path || !*path) return;
  if (std::FILE* f = std::fopen(path, "w")) {
    std::fprintf(f, "%d\n", rc);
    std::fclose(f);
  }
}

}  // namespace

int run_job(const RunOptions& o, int argc, char** argv) {
  // USR1 and TERM (Slurm's warnings) are caught since main's first instruction (stop_signals.h).
  mpi::MpiEnv env(&argc, &argv);
  // A client that hangs up, or an mpirun that is going away and closed our
  // stdout, is not our death: rank 0 still commits what it wrote.
  std::signal(SIGPIPE, SIG_IGN);
  if (o.serve) std::signal(SIGINT, on_interrupt);  // Ctrl-C in an interactive allocation drains too
  // Past the agreed start-up checks, a failure on one rank cannot be waited
  // out by the others: whatever was thrown, one line and every rank stops.
  std::string what;
  try {
    const int rc = run(env, o);
    if (env.rank() == 0) note_exit(rc);
    return rc;
  } catch (const service::RouterLost& e) {
    // A worker cut off from rank 0: MPI_Abort would try to reach the ranks it cannot reach, and may wait for
    // ever; this rank ends itself now (its launcher, srun or mpirun, then ends its node's part of the job).
    std::fprintf(stderr, "tandem: error: [rank %d] %s\n", env.rank(), e.what());
    std::fflush(stderr);
    std::_Exit(3);
  } catch (const Error& e) {
    what = e.what();
  } catch (const std::bad_alloc&) {
    what = "out of memory";
  } catch (const std::exception& e) {
    what = std::string("internal error: ") + e.what() + " (please report it)";
  } catch (...) {
    what = "internal error: an unknown exception (please report it)";
  }
  std::fprintf(stderr, "tandem: error: [rank %d] %s\n", env.rank(), what.c_str());
  std::fflush(stderr);
  // MPI_Abort reaches out to every rank; with one cut off it can wait for ever: this rank ends regardless.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::_Exit(3);
  }).detach();
  MPI_Abort(env.world(), 3);  // a job that lost a rank cannot finish; stop every rank now
  return 3;
}

}  // namespace tandem::launcher
