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
#include "mpi_transport/collectives.h"
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

namespace {

// A worker's parts, made one step at a time (load_worker runs the steps and
// agrees on each); each step reads what the ones before it made.
class WorkerLoader {
 public:
  WorkerLoader(const Prepared& p, const Layout& l, const Node& node, WorkerParts& w)
      : p_(p), l_(l), node_(node), w_(w), width_(l.group.width), layout_(kv_layout(p, width_)) {}

  // The weights mapped (a one-rank worker's packed into panels), and how many KV blocks the pool holds.
  void weights() {
    // A tensor-parallel rank copies its shard out of the mapping: panels of the whole model would be wasted.
    w_.weights = runtime::ModelWeights::load(p_.model, p_.cfg.model.path,
                                             runtime::backend_wants_panels(backend()) && width_ == 1 && !l_.regroups());
    if (l_.regroups()) {  // one pool for both forms, registered once: this form's whole blocks of it
      const uint64_t bytes = cell_pool_bytes(p_, node_.local_workers, width_, l_.other.width);
      w_.pool_capacity = bytes - bytes % layout_.block_bytes();  // what the transport registers
      blocks_ = static_cast<int64_t>(w_.pool_capacity / layout_.block_bytes());
    } else {
      blocks_ = pool_blocks(p_, node_.local_workers, width_);
    }
    if (width_ > 1)  // the leader's block numbers hold on every rank of the group: the same count everywhere
      TANDEM_MPI_OR_THROW(MPI_Allreduce(MPI_IN_PLACE, &blocks_, 1, MPI_INT64_T, MPI_MIN, l_.group_comm.get()));
  }

  // The KV pool: in the transport's window where KV moves between workers, else device or host memory.
  void pool() {
    using topology::Side;
    if (l_.roles.disaggregated() || l_.planned) {
      void* base = nullptr;
      const bool two_widths = l_.roles.disaggregated() && l_.roles.width(Side::kPrefill) != l_.roles.width(Side::kDecode);
      const TransportKind t = transport_for(p_.cfg.choices, two_widths);
      // A cell's rank registers all of its pool: the blocks of its other form may be more, or larger.
      const int64_t registered = l_.regroups() ? static_cast<int64_t>(w_.pool_capacity / layout_.block_bytes()) : blocks_;
      w_.transport.reset(open_transport(t, l_.workers.get(), layout_.block_bytes(), registered, &base,
                                        t == TransportKind::kNccl ? mpi::DevicePool{} : staging_pool(backend()),
                                        p_.cfg.transport.libfabric_provider)
                             .release());
      w_.pool_base = static_cast<float*>(base);
      w_.pool = std::make_unique<kv::BlockPool>(layout_, blocks_, w_.pool_base);
    } else if (!p_.cfg.choices.on_cpu()) {
      w_.device_pool = runtime::allocate_pool_memory(backend(), static_cast<std::size_t>(blocks_) * layout_.block_bytes());
      w_.pool = std::make_unique<kv::BlockPool>(layout_, blocks_, static_cast<float*>(w_.device_pool.get()));
    } else {
      w_.pool = std::make_unique<kv::BlockPool>(layout_, blocks_);
    }
  }

  // The group's GPU exchange (NCCL), collective over the group: a step of
  // its own, so that no rank that failed before it is waited for.
  void device_group() {
    if (width_ > 1 && !p_.cfg.choices.on_cpu()) w_.device_group = mpi::make_device_group(l_.group_comm.get());
  }

  // A cell's rank sets up its other form's exchange too, for the same reason: a regroup sets up none.
  void other_device_group() {
    if (l_.regroups() && l_.other.width > 1 && !p_.cfg.choices.on_cpu())
      w_.other_device_group = mpi::make_device_group(l_.other_comm.get());
  }

  // Threads, the KV tiers (on a leader) and this rank's shard of the model.
  void engine() {
    const int n_threads = p_.cfg.cluster.threads_per_rank > 0
                              ? static_cast<int>(p_.cfg.cluster.threads_per_rank)
                              : std::max(1, runtime::cpu::ThreadPool::available_cpus() / node_.cpu_sharers);
    const int node_cpus = static_cast<int>(std::thread::hardware_concurrency());
    if (p_.cfg.cluster.threads_per_rank == 0 && runtime::cpu::ThreadPool::available_cpus() == 1 &&
        node_cpus > node_.local_workers)
      spdlog::warn("this worker may run on 1 of the node's {} CPUs (its MPI binding), so it computes on one thread; "
                   "with mpirun add --bind-to none, or give each rank cores (--map-by slot:PE=N)", node_cpus);
    w_.threads = std::make_unique<runtime::cpu::ThreadPool>(n_threads);
    // The tiers hold whole blocks (every KV head), on a group's leader: a store is read at any width.
    // A cell's rank that leads in either form keeps its tiers across regroups (they hold whole blocks).
    const int rank = l_.rank;
    if (l_.group.place == 0 || (l_.regroups() && l_.other.place == 0))
      w_.tiers = open_tiers(p_, kv_layout(p_, 1), rank <= topology::first_leader(l_.roles), width_ > 1 || l_.regroups());
    if (w_.tiers && width_ == 1 && l_.group.place == 0) w_.pool->set_lower(w_.tiers.get());  // a group's: through its GroupTier (run_worker)
    if (width_ > 1) w_.group = std::make_unique<mpi::MpiTpGroup>(l_.group_comm.get());
    w_.model = runtime::make_backend(backend(), p_.model, *w_.weights, *w_.pool, *w_.threads, w_.group.get(),
                                     w_.device_group.get(), p_.cfg.cluster.expert_parallel);
    const std::string tp = width_ == 1 ? std::string()
                                       : fmt::format(", tensor-parallel rank {} of {} (leader rank {})", l_.group.place,
                                                     width_, l_.roles.map().leader_of(rank));
    spdlog::info("worker ready: {} {} KV blocks of {} tokens ({:.2f} GiB{}), {} threads, {}{}", blocks_,
                 layout_.dtype_name(), p_.cfg.kv.block_size,
                 static_cast<double>(blocks_) * static_cast<double>(layout_.block_bytes()) / (1 << 30),
                 w_.transport ? std::string(", ") + std::string(w_.transport->name()) + " window" : std::string(), n_threads,
                 p_.cfg.choices.on_cpu() ? std::string(runtime::cpu::kernels().name) + " kernels" : "backend " + backend(), tp);
  }

 private:
  const std::string& backend() const { return p_.cfg.model.backend; }
  const Prepared& p_;
  const Layout& l_;
  const Node& node_;
  WorkerParts& w_;
  const int width_;
  const kv::KvLayout layout_;
  int64_t blocks_ = 0;
};

// The steps, in order, each with what a failed allocation in it tells the user.
struct LoadStep {
  void (WorkerLoader::*run)();
  const char* out_of_memory;
};
constexpr LoadStep kLoadSteps[] = {
    {&WorkerLoader::weights, "out of memory loading the model's weights; run fewer ranks per node "
                             "(cluster.threads_per_rank gives each more cores)"},
    {&WorkerLoader::pool, "out of memory allocating the KV pool; lower kv.memory_gib (0 sizes it from the memory left)"},
    {&WorkerLoader::device_group, "out of memory setting up the tensor-parallel group's GPU exchange"},
    {&WorkerLoader::other_device_group, "out of memory setting up the other width's GPU exchange"},
    {&WorkerLoader::engine, "out of memory setting up the engine and the KV tiers; lower kv.host_cache_gib or kv.memory_gib"},
};

}  // namespace

bool load_worker(const mpi::MpiEnv& env, const Prepared& p, const Layout& l, const Node& node, WorkerParts& w) {
  const bool worker = env.rank() != 0 || env.size() == 1;
  WorkerLoader load(p, l, node, w);
  std::string failed;
  for (const LoadStep& step : kLoadSteps) {
    if (worker && failed.empty()) failed = setup_error([&] { (load.*step.run)(); }, step.out_of_memory);
    if (!agreed(env, failed)) return false;  // every rank learns after each step whether any worker failed
  }
  return true;
}

// The engine over this rank's model (the leader's wrapper, in a group).
std::unique_ptr<service::WorkerCore> make_core(int rank, const Prepared& p, const Layout& l, WorkerParts& w,
                                               std::unique_ptr<runtime::ModelBackend> model) {
  runtime::EngineOptions options = engine_options(p);
  options.sampling_threads = w.threads.get();  // a step's draws, in parallel
  auto core = std::make_unique<service::WorkerCore>(rank, l.role(), p.model, std::move(model), *w.pool, p.tokenizer.get(),
                                                    options, w.tiers.get());
  if (w.tiers && rank == topology::first_leader(l.roles) && l.incarnation == 0)
    core->share_store_index();  // rank 0 learns the store's blocks once
  core->set_group_width(l.group.width);
  if (l.incarnation > 0) core->count_tiers_from_now();  // the tiers outlived this rank's earlier workers
  return core;
}

namespace {

// One worker this rank is part of, until rank 0 says stop, or (a cell's)
// regroup: then the regroup's WireRoles, as it came; else empty.
std::vector<uint8_t> run_incarnation(int rank, const Prepared& p, Layout& l, WorkerParts& w, mpi::Mailbox& box) {
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
  const topology::GroupMap& map = l.roles.map();
  const kv::KvLayout layout = w.pool->layout();
  const service::KvShape shape{p.model.kv_heads, layout.head_rows(), layout.head_run_bytes()};
  std::optional<service::GroupBlocks> blocks;
  if (w.group) blocks.emplace(*w.group, *w.pool, shape, runtime::pool_copy(p.cfg.model.backend));
  if (l.group.place > 0) {
    service::Follower follower(port, *w.model, l.group.place, l.group.width, map, shape, *blocks);
    until([&] { return follower.finished(); }, [&] { return follower.tick(); });
    return follower.stop_note();
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
  const bool grouped = l.roles.width(topology::Side::kPrefill) > 1 || l.roles.width(topology::Side::kDecode) > 1 || l.regroups();
  service::WorkerPort& to_job = grouped ? static_cast<service::WorkerPort&>(group_port) : port;
  auto core = make_core(rank, p, l, w,
                        l.group.width > 1 ? std::make_unique<service::LeaderBackend>(std::move(w.model), group_port)
                                          : std::move(w.model));
  service::WorkerService worker_service(*core, to_job, [rank](service::Role r) { log::set_identity(rank, service::role_name(r)); });
  worker_service.set_router_timeout(p.cfg.job.worker_timeout_seconds);  // rank 0 pings (MpiLink)
  // While KV moves, look again within 50 us: some transports progress only when called.
  while (!worker_service.finished()) {
    if (worker_service.tick()) idle.reset();
    else idle.idle(worker_service.moving_kv() ? 50 : 2000);
  }
  group_port.set_stop_note(worker_service.regroup_note());  // the followers regroup too
  worker_service.finish();
  return worker_service.regroup_note();
}


// A cell's rank after a regroup: its place in the cell's other form, the
// same memory laid out as that form's KV blocks, and its shard of the model
// at that width (the mapped weights and the tiers stay; the pool's contents go).
void regroup(int rank, const Prepared& p, Layout& l, WorkerParts& w, const service::WireRoles& roles) {
  // Where it stands next is data (topology::regroup); here it is carried out.
  static_cast<topology::Place&>(l) = topology::regroup(l, roles.prefill_ranks);
  std::swap(l.group_comm, l.other_comm);
  log::set_identity(rank, service::role_name(l.role()));
  // The old worker's parts go first: the model reads the pool, the pool's lower tier is the tiers.
  w.model.reset();
  w.group.reset();
  std::swap(w.device_group, w.other_device_group);  // both were set up at the start (GPU backends)
  w.pool.reset();
  const kv::KvLayout layout = kv_layout(p, l.group.width);
  int64_t blocks = static_cast<int64_t>(w.pool_capacity / layout.block_bytes());
  if (l.group.width > 1) blocks = mpi::min_over(l.group_comm.get(), blocks);  // its ranks leave their old workers one by one
  w.pool = std::make_unique<kv::BlockPool>(layout, blocks, w.pool_base);
  if (Status st = w.transport->relayout(rank - 1, layout.block_bytes(), blocks); !st.ok()) throw Error(st.to_string());
  if (w.tiers && l.group.width == 1 && l.group.place == 0) w.pool->set_lower(w.tiers.get());
  if (l.group.width > 1) w.group = std::make_unique<mpi::MpiTpGroup>(l.group_comm.get());
  w.model = runtime::make_backend(p.cfg.model.backend, p.model, *w.weights, *w.pool, *w.threads, w.group.get(),
                                  w.device_group.get(), p.cfg.cluster.expert_parallel);
  spdlog::info("epoch {}: regrouped: {} worker of {} rank(s){}, {} KV blocks", roles.epoch,
               l.role() == service::Role::kWorker ? "an aggregated" : std::string("a ") + std::string(service::role_name(l.role())),
               l.group.width,
               l.group.width == 1 ? std::string()
                                  : fmt::format(" (tensor-parallel rank {}, leader rank {})", l.group.place,
                                                l.roles.map().leader_of(rank)),
               blocks);
}

}  // namespace

// A worker rank under MPI: its service, reached through the MPI port, until
// rank 0 says stop; in a tensor-parallel group the leader's service tells the
// followers what to run (runtime/service/group_worker.h). A cell's rank
// regroups as often as rank 0 says (router/regroups.h), a worker at a time.
void run_worker(const mpi::MpiEnv& env, const Prepared& p, Layout& l, WorkerParts& w, mpi::Mailbox& box) {
  for (;;) {
    const std::vector<uint8_t> note = run_incarnation(env.rank(), p, l, w, box);
    if (note.empty()) {
      // A cell's rank whose last worker followed still holds the tiers it led with (a leader's worker closed
      // them): their last writes, and any warning about them, now rather than silently at exit.
      if (w.tiers) {
        std::vector<std::string> warnings;
        w.tiers->close(warnings);
        for (const auto& x : warnings) spdlog::warn("{}", x);
      }
      return;
    }
    regroup(env.rank(), p, l, w, service::decode_roles(note));
  }
}

}  // namespace tandem::launcher
