#include "launcher/run/worker_rank.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/backoff.h"
#include "common/error.h"
#include "common/log.h"
#include "launcher/run/job_setup.h"
#include "launcher/run/transport_setup.h"
#include "mpi_transport/mpi_check.h"
#include "mpi_transport/mpi_worker_port.h"
#include "mpi_transport/transport_registry.h"
#include "runtime/cpu/kernels.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/service/group_worker.h"
#include "runtime/service/worker_service.h"

namespace tandem::launcher {

void TransportCloser::operator()(mpi::KvTransport* t) const {
  if (std::uncaught_exceptions() == 0) {
    if (Status st = t->destroy(); !st.ok()) spdlog::warn("closing the KV transport: {}", st.to_string());
  }
  delete t;
}

bool load_worker(const mpi::MpiEnv& env, const Prepared& p, const Layout& l, const Node& node, WorkerParts& w) {
  const int rank = env.rank();
  const bool worker = rank != 0 || env.size() == 1;
  const std::string& backend = p.cfg.model.backend;
  const int width = l.group.width;
  std::string failed;
  auto phase = [&](const char* out_of_memory, auto&& work) {
    if (worker && failed.empty()) failed = setup_error(work, out_of_memory);
    return agreed(env, failed);
  };
  int64_t blocks = 0;
  const kv::KvLayout layout = kv_layout(p, width);
  return phase("out of memory loading the model's weights; run fewer ranks per node (cluster.threads_per_rank gives each "
               "more cores)", [&] {
    // A tensor-parallel rank copies its shard out of the mapping: panels of the whole model would be wasted.
    w.weights = runtime::ModelWeights::load(p.model, p.cfg.model.path, runtime::backend_wants_panels(backend) && width == 1);
    blocks = pool_blocks(p, node.local_workers, width);
    if (width > 1)  // the leader's block numbers hold on every rank of the group: the same count everywhere
      TANDEM_MPI_OR_THROW(MPI_Allreduce(MPI_IN_PLACE, &blocks, 1, MPI_INT64_T, MPI_MIN, l.group_comm.get()));
  }) && phase("out of memory allocating the KV pool; lower kv.memory_gib (0 sizes it from the memory left)", [&] {
    if (l.roles.prefill > 0 || l.planned) {
      void* base = nullptr;
      const TransportKind t = transport_for(p.cfg.choices, l.roles.prefill > 0 && l.roles.prefill_tp != l.roles.decode_tp);
      w.transport.reset(open_transport(t, l.workers.get(), layout.block_bytes(), blocks, &base,
                                       t == TransportKind::kNccl ? mpi::DevicePool{} : staging_pool(backend),
                                       p.cfg.transport.libfabric_provider)
                            .release());
      w.pool = std::make_unique<kv::BlockPool>(layout, blocks, static_cast<float*>(base));
    } else if (!p.cfg.choices.on_cpu()) {
      w.device_pool = runtime::allocate_pool_memory(backend, static_cast<std::size_t>(blocks) * layout.block_bytes());
      w.pool = std::make_unique<kv::BlockPool>(layout, blocks, static_cast<float*>(w.device_pool.get()));
    } else {
      w.pool = std::make_unique<kv::BlockPool>(layout, blocks);
    }
  }) && phase("out of memory setting up the tensor-parallel group's GPU exchange", [&] {
    // Collective over the group (NCCL): in a phase of its own, so that no rank that failed before it is waited for.
    if (width > 1 && !p.cfg.choices.on_cpu()) w.device_group = mpi::make_device_group(l.group_comm.get());
  }) && phase("out of memory setting up the engine and the KV tiers; lower kv.host_cache_gib or kv.memory_gib", [&] {
    const int n_threads = p.cfg.cluster.threads_per_rank > 0
                              ? static_cast<int>(p.cfg.cluster.threads_per_rank)
                              : std::max(1, runtime::cpu::ThreadPool::available_cpus() / node.cpu_sharers);
    const int node_cpus = static_cast<int>(std::thread::hardware_concurrency());
    if (p.cfg.cluster.threads_per_rank == 0 && runtime::cpu::ThreadPool::available_cpus() == 1 &&
        node_cpus > node.local_workers)
      spdlog::warn("this worker may run on 1 of the node's {} CPUs (its MPI binding), so it computes on one thread; "
                   "with mpirun add --bind-to none, or give each rank cores (--map-by slot:PE=N)", node_cpus);
    w.threads = std::make_unique<runtime::cpu::ThreadPool>(n_threads);
    // The tiers hold whole blocks (every KV head), on a group's leader: a store is read at any width.
    if (l.group.place == 0) w.tiers = open_tiers(p, kv_layout(p, 1), rank <= first_leader(l.roles), width > 1);
    if (w.tiers && width == 1) w.pool->set_lower(w.tiers.get());  // a group's: through its GroupTier (run_worker)
    if (width > 1) w.group = std::make_unique<mpi::MpiTpGroup>(l.group_comm.get());
    w.model = runtime::make_backend(backend, p.model, *w.weights, *w.pool, *w.threads, w.group.get(),
                                    w.device_group.get());
    const std::string tp = width == 1 ? std::string()
                                      : fmt::format(", tensor-parallel rank {} of {} (leader rank {})", l.group.place,
                                                    width, l.roles.map().leader_of(rank));
    spdlog::info("worker ready: {} {} KV blocks of {} tokens ({:.2f} GiB{}), {} threads, {}{}", blocks,
                 layout.elem_bytes == 2 ? "bf16" : "f32", p.cfg.kv.block_size,
                 static_cast<double>(blocks) * static_cast<double>(layout.block_bytes()) / (1 << 30),
                 w.transport ? std::string(", ") + std::string(w.transport->name()) + " window" : std::string(), n_threads,
                 p.cfg.choices.on_cpu() ? std::string(runtime::cpu::kernels().name) + " kernels" : "backend " + backend, tp);
  });
}

// The engine over this rank's model (the leader's wrapper, in a group).
std::unique_ptr<service::WorkerCore> make_core(int rank, const Prepared& p, const Layout& l, WorkerParts& w,
                                               std::unique_ptr<runtime::ModelBackend> model) {
  runtime::EngineOptions options = engine_options(p);
  options.sampling_threads = w.threads.get();  // a step's draws, in parallel
  auto core = std::make_unique<service::WorkerCore>(rank, l.role, p.model, std::move(model), *w.pool, p.tokenizer.get(),
                                                    options, w.tiers.get());
  if (w.tiers && rank == first_leader(l.roles)) core->share_store_index();  // rank 0 learns the store's blocks once
  core->set_group_width(l.group.width);
  return core;
}

// A worker rank under MPI: its service, reached through the MPI port, until
// rank 0 says stop; in a tensor-parallel group the leader's service tells the
// followers what to run (runtime/service/group_worker.h).
void run_worker(const mpi::MpiEnv& env, const Prepared& p, Layout& l, WorkerParts& w, mpi::Mailbox& box) {
  const int rank = env.rank();
  mpi::MpiWorkerPort port(box, w.transport.get());
  // A rank waiting in its group's exchange still moves KV on: no rank waits on it for ever.
  if (w.group) w.group->set_progress([&port] { port.pump(); });
  if (w.device_group) w.device_group->set_progress([&port] { port.pump(); });
  struct Unhook {
    mpi::MpiTpGroup* group;
    runtime::DeviceGroup* device_group;
    ~Unhook() {
      if (group) group->set_progress({});
      if (device_group) device_group->set_progress({});
    }
  } unhook{w.group.get(), w.device_group.get()};
  mpi::Backoff idle;
  auto until = [&](auto&& done, auto&& tick) {
    while (!done()) {
      if (tick()) idle.reset();
      else idle.idle();
    }
  };
  const service::GroupMap& map = l.roles.map();
  const kv::KvLayout layout = w.pool->layout();
  const service::KvShape shape{p.model.kv_heads, layout.head_rows(), layout.head_run_bytes()};
  std::optional<service::GroupBlocks> blocks;
  if (w.group) blocks.emplace(*w.group, *w.pool, shape, runtime::pool_copy(p.cfg.model.backend));
  if (l.group.place > 0) {
    service::Follower follower(port, *w.model, l.group.place, l.group.width, map, shape, *blocks);
    until([&] { return follower.finished(); }, [&] { return follower.tick(); });
    return;
  }
  std::vector<int> followers = map.members(rank);
  followers.erase(followers.begin());  // the leader's own
  // In a job with groups every worker's KV follows the routes between widths, one-rank workers' too.
  service::LeaderPort group_port(port, followers, map, shape);
  // A group's blocks reach the tiers below its pool whole (gathered from every rank).
  std::optional<service::GroupTier> group_tier;
  struct Unlower {  // the pool outlives the GroupTier
    kv::BlockPool* pool = nullptr;
    ~Unlower() {
      if (pool) pool->set_lower(nullptr);
    }
  } unlower;
  if (w.tiers && blocks) {
    group_tier.emplace(*w.tiers, *blocks, group_port, *w.pool);
    w.pool->set_lower(&*group_tier);
    unlower.pool = w.pool.get();
  }
  const bool grouped = l.roles.prefill_tp > 1 || l.roles.decode_tp > 1;
  service::WorkerPort& to_job = grouped ? static_cast<service::WorkerPort&>(group_port) : port;
  auto core = make_core(rank, p, l, w,
                        l.group.width > 1 ? std::make_unique<service::LeaderBackend>(std::move(w.model), group_port)
                                          : std::move(w.model));
  service::WorkerService worker_service(*core, to_job, [rank](service::Role r) { log::set_identity(rank, service::role_name(r)); });
  // While KV moves, look again within 50 us: some transports progress only when called.
  while (!worker_service.finished()) {
    if (worker_service.tick()) idle.reset();
    else idle.idle(worker_service.moving_kv() ? 50 : 2000);
  }
  worker_service.finish();
}

}  // namespace tandem::launcher
