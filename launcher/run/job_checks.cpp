#include "launcher/run/job_checks.h"

#include <sys/sysinfo.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <tuple>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "router/input_file.h"
#include "launcher/run/transport_setup.h"
#include "mpi_transport/transport_registry.h"
#include "runtime/cpu/tp_group.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/model/weights.h"
#include "slurm/resumable_output.h"
#include "slurm/slurm_env.h"

namespace tandem::launcher {

void check_files(Prepared& p) {
  if (const std::string busy = slurm::output_in_use(p.cfg.job.output); !busy.empty()) throw Error(busy);
  const auto env = slurm::SlurmEnv::from_environment();
  slurm::OutputShard share{env.array_task_id, env.shard_index(), env.shard_count()};
  if (const auto recorded = slurm::recorded_shard(p.cfg.job.output))  // an array task's output: the same share
    share = slurm::continue_shard(*recorded, share, p.cfg.job.output);
  if (std::filesystem::is_directory(p.cfg.job.input))
    throw Error(p.cfg.job.input + ": is a directory, not a JSONL file; check job.input or --input");
  // Readable, and text (plain, gzip or zstd): anything else stops here, saying what it looks like.
  try {
    (void)router::InputFile(p.cfg.job.input, p.max_line_bytes);
  } catch (const Error& e) {  // a small damaged .gz shows it here, in its first bytes
    throw Error(std::string(e.what()) + router::InputScan::kFoundBeforeWork);
  }
  for (const auto& path : {p.cfg.job.output, p.cfg.job.summary}) {
    const bool existed = std::filesystem::exists(path);
    std::ofstream f(path, std::ios::app);
    if (!f) throw Error(path + ": cannot write here (" + std::strerror(errno) + "); check the path and permissions");
    f.close();
    if (!existed) std::filesystem::remove(path);
  }
  std::error_code ec;
  if (!p.cfg.job.resume && std::filesystem::exists(p.cfg.job.output) && std::filesystem::file_size(p.cfg.job.output, ec) > 0)
    throw Error(p.cfg.job.output + ": the output already exists; pass --resume (or set job.resume = true) to continue "
                "it, or choose another output");
  runtime::ModelWeights::load(p.model, p.cfg.model.path, /*panels=*/false);  // maps and shape-checks; reads no weights
  // Last, as the slowest: compressed input whole, and on --resume every line against the checkpoint.
  p.input_scan = router::InputScan::run(
      {p.cfg.job.input, p.cfg.job.output, p.max_line_bytes, p.cfg.job.resume, share.index, share.count});
  if (const auto& s = p.input_scan) {
    spdlog::info("input read through before any work in {:.1f} s: {} lines ({} {:.1f} MB){}", s->seconds(), s->lines(),
                 router::InputFile::name(s->format()),
                 static_cast<double>(s->decoded_bytes()) / 1e6,
                 p.cfg.job.resume ? fmt::format(", {} of {} answered already", s->answered(), s->requests()) : "");
  }
}

void check_backend(const Prepared& p, int ranks) {
  const std::string& b = p.cfg.model.backend;
  const Choices& c = p.cfg.choices;
  if (c.transport == TransportKind::kLibfabric && !mpi::optional_transport_built("libfabric"))
    throw Error("transport.backend = \"libfabric\": this tandem was built without libfabric (install libfabric-dev and "
                "rebuild, or cmake -DTANDEM_LIBFABRIC=ON); use \"auto\"");
  if (c.transport == TransportKind::kLibfabric && !c.on_cpu())
    throw Error("transport.backend = \"libfabric\" moves KV in host memory, not a GPU's pool; with model.backend = \"" +
                b + "\" use \"nccl\" (which reaches EFA through its plugin) or \"auto\"");
  if (c.on_cpu()) {
    if (c.transport == TransportKind::kNccl)
      throw Error("transport.backend = \"nccl\" moves KV between GPUs; it needs model.backend = \"cuda\"");
    return;
  }
  if (const std::string why = runtime::backend_unavailable(b); !why.empty())
    throw Error("model.backend = \"" + b + "\": " + why + "; use \"cpu\" or run where a GPU is visible");
  const bool disaggregated = ranks > 2 && c.mode != JobMode::kAgg;
  const TransportKind t = transport_for(c, p.cfg.cluster.prefill_width() != p.cfg.cluster.decode_width());
  if (!disaggregated) return;
  if (t == TransportKind::kNccl && !mpi::optional_transport_built("nccl"))
    throw Error("transport.backend = \"nccl\": this tandem was built without NCCL (cmake -DTANDEM_NCCL=ON); use "
                "\"mpi_two_sided\" or \"auto\" (two-sided MPI through host memory)");
  if (t != TransportKind::kNccl && t != TransportKind::kMpiTwoSided)
    throw Error(std::string("transport.backend = \"") + transport_name(t) + "\" exposes host memory, not the GPU's KV pool; with model.backend = \"" +
                b + "\" use \"nccl\", \"mpi_two_sided\" (staged through host memory) or \"auto\"");
}

kv::KvLayout kv_layout(const Prepared& p, int tp) {
  const int64_t kv_heads = runtime::cpu::shard_config(p.model, {0, tp}).kv_heads;
  kv::KvLayout l{p.model.layers, kv_heads, p.model.head_dim, p.cfg.kv.block_size};
  const std::string& d = p.cfg.kv.dtype;
  const bool bf16 = d == "bf16" || (d == "auto" && !p.cfg.choices.on_cpu() && p.model.dtype != runtime::DType::kF32);
  l.elem_bytes = bf16 ? 2 : 4;
  return l;
}

double device_pool_room(const Prepared& p, double weights, double free, int tp) {
  const auto& m = p.model;
  if (tp > 1) {  // a rank of a group holds its shard of the layers, and the embedding and LM head whole
    // (counted as two matrices even where tied: a tied checkpoint may still ship lm_head.weight, which is loaded)
    const double replicated = 2.0 * static_cast<double>(m.vocab * m.hidden) * static_cast<double>(runtime::dtype_size(m.dtype));
    weights = std::max(0.0, weights - replicated) / tp + replicated;
  }
  // Left for a step's buffers (activations, the rounded GEMM input, logits of every sequence), NCCL and cuBLAS.
  const double rows = static_cast<double>(p.cfg.job.max_batched_tokens);
  // x, y, last; qkv, q, attn; gate/up; the rounded product input (float32 at most) — as CudaModel::launch.
  const double widths = static_cast<double>(3 * m.hidden + 3 * m.heads * m.head_dim + 2 * m.kv_heads * m.head_dim +
                                            2 * m.intermediate + std::max({m.hidden, m.heads * m.head_dim, m.intermediate}));
  const double step = rows * widths * 4 + static_cast<double>(p.cfg.job.max_num_seqs * m.vocab) * 4 +
                      (tp > 1 ? rows * static_cast<double>(m.hidden * tp) * 4 : 0.0);  // a group's gathered sums
  return std::max(0.0, 0.9 * (free - weights - step - static_cast<double>(1 << 30)));
}

namespace {

// A worker rank's pool at width `tp`, in bytes: what it wants (max_num_seqs
// whole contexts) and the room it has (the node's memory share, or the GPU's
// after the weights); kv.memory_gib sets both.
struct PoolRoom {
  double want = 0, room = 0;
};

PoolRoom pool_room(const Prepared& p, int local_ranks, int tp) {
  const double block = static_cast<double>(kv_layout(p, tp).block_bytes());
  if (p.cfg.kv.memory_gib > 0) {
    if (p.cfg.choices.on_cpu()) {  // more than the node has: one line now, not an allocation failure later
      struct sysinfo si {};
      sysinfo(&si);
      const double total_gib = static_cast<double>(si.totalram) * si.mem_unit / (1 << 30);
      if (p.cfg.kv.memory_gib * local_ranks > total_gib) {
        char line[320];
        std::snprintf(line, sizeof line,
                      "kv.memory_gib = %g for each of %d worker(s) on this node is more than its %.1f GiB of memory; "
                      "lower it (0 sizes the pool from the memory left)",
                      p.cfg.kv.memory_gib, local_ranks, total_gib);
        throw Error(line);
      }
    }
    const double bytes = p.cfg.kv.memory_gib * (1 << 30);
    return {bytes, bytes};
  }
  const double want = block * static_cast<double>(p.cfg.job.max_num_seqs *
                                                  ((p.max_model_len + p.cfg.kv.block_size - 1) / p.cfg.kv.block_size));
  if (!p.cfg.choices.on_cpu()) {  // the device's free memory less the weights (not yet loaded), a step and 1 GiB; 90%
    double weights = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(p.cfg.model.path, ec))
      if (e.path().extension() == ".safetensors") weights += static_cast<double>(e.file_size(ec));
    return {want, device_pool_room(p, weights, static_cast<double>(runtime::backend_free_bytes(p.cfg.model.backend)), tp)};
  }
  struct sysinfo si {};
  sysinfo(&si);
  return {want, static_cast<double>(si.freeram + si.bufferram) * si.mem_unit * 0.6 / std::max(1, local_ranks)};
}

}  // namespace

int64_t pool_blocks(const Prepared& p, int local_ranks, int tp) {
  const PoolRoom r = pool_room(p, local_ranks, tp);
  return std::max<int64_t>(1, static_cast<int64_t>(std::min(r.want, r.room) /
                                                   static_cast<double>(kv_layout(p, tp).block_bytes())));
}

uint64_t cell_pool_bytes(double want_a, double room_a, double want_b, double room_b, uint64_t block_a, uint64_t block_b) {
  const double bytes = std::min({room_a, room_b, std::max(want_a, want_b)});
  return std::max(static_cast<uint64_t>(bytes), std::max(block_a, block_b));
}

uint64_t cell_pool_bytes(const Prepared& p, int local_ranks, int tp_a, int tp_b) {
  const PoolRoom a = pool_room(p, local_ranks, tp_a), b = pool_room(p, local_ranks, tp_b);
  return cell_pool_bytes(a.want, a.room, b.want, b.room, kv_layout(p, tp_a).block_bytes(), kv_layout(p, tp_b).block_bytes());
}

Roles::Group Roles::group_of(int rank) const {
  if (rank < 1) return {1, 0, false};  // rank 0 routes (or, alone, is a one-rank worker)
  return {groups.width_at(rank), groups.place_of(rank), groups.prefill_at(rank)};
}

namespace {

std::string ranks_word(int n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); }

// ranks must be whole workers of `tp` ranks each.
void check_whole(const char* key, int ranks, const char* tp_key, int tp) {
  if (ranks % tp != 0)
    throw Error(std::string(key) + " = " + std::to_string(ranks) + " is not a multiple of " + tp_key + " = " +
                std::to_string(tp) + " (a worker is " + ranks_word(tp) + "); make it one");
}

Roles in_rank_order(int prefill, int decode, int prefill_tp, int decode_tp) {
  return {prefill, decode, prefill_tp, decode_tp, service::GroupMap(prefill, prefill_tp, decode, decode_tp)};
}

}  // namespace

Roles plan_roles(const Config& cfg, int world_size) {
  const int workers = std::max(1, world_size - 1);
  const int a = cfg.cluster.prefill_width(), b = cfg.cluster.decode_width();
  if (b > 1 && world_size - 1 < b)
    throw Error("cluster.decode_tp (or tp) = " + std::to_string(b) + ": a worker of " + ranks_word(b) + " needs at least " +
                std::to_string(b + 1) + " ranks (rank 0 routes); this job has " + std::to_string(world_size) +
                "; start more, or lower the width");
  // Aggregated: every worker does both, at the decode width. So is a job with room for one worker only.
  if (cfg.choices.mode == JobMode::kAgg || world_size <= 2 || workers < a + b) {
    if (workers % b != 0)
      throw Error("the " + std::to_string(workers) + " worker ranks of this job (ranks - 1) are not whole workers of " +
                  ranks_word(b) + " (cluster.decode_tp, or tp); start a multiple of " + std::to_string(b) +
                  " worker ranks");
    return in_rank_order(0, workers, a, b);
  }
  int p = static_cast<int>(cfg.cluster.prefill_ranks);
  int d = static_cast<int>(cfg.cluster.decode_ranks);
  // Two widths under the planner: the workers are cells of lcm(a, b) ranks, each running prefill workers or decode ones.
  const int cell = cfg.choices.mode == JobMode::kAuto && a != b ? std::lcm(a, b) : 0;
  if (cell > 0 && workers % cell != 0)
    throw Error("cluster.prefill_tp = " + std::to_string(a) + " and cluster.decode_tp = " + std::to_string(b) +
                " under job.mode = \"auto\" make the workers cells of " + ranks_word(cell) + " (each runs prefill "
                "workers or decode workers, as the planner splits them); the " + std::to_string(workers) +
                " worker ranks of this job (ranks - 1) are not whole cells: start a multiple of " +
                std::to_string(cell) + " worker ranks");
  if (p == 0 && d == 0) {  // the split nearest prefill_fraction in whole workers of each width (or whole cells)
    const double want = cfg.cluster.prefill_fraction * workers;
    for (int k = cell > 0 ? cell : a; k <= workers - b; k += cell > 0 ? cell : a)
      if ((workers - k) % b == 0 && (p == 0 || std::abs(k - want) < std::abs(p - want))) p = k;
    if (p == 0)
      throw Error("the " + std::to_string(workers) + " worker ranks of this job (ranks - 1) cannot be split into prefill "
                  "workers of " + ranks_word(a) + " and decode workers of " + ranks_word(b) +
                  "; start a number of ranks that can, or set job.mode = \"agg\"");
  } else if (p == 0) {
    p = workers - d;
  } else if (d == 0) {
    d = workers - p;
  }
  if (d == 0) d = workers - p;
  const bool one_set = (cfg.cluster.prefill_ranks > 0) != (cfg.cluster.decode_ranks > 0);
  if (one_set && (p < 1 || d < 1)) {
    const bool pre = cfg.cluster.prefill_ranks > 0;
    throw Error(std::string(pre ? "cluster.prefill_ranks" : "cluster.decode_ranks") + " = " +
                std::to_string(pre ? cfg.cluster.prefill_ranks : cfg.cluster.decode_ranks) + " leaves no " +
                (pre ? "decode" : "prefill") + " rank among the " + std::to_string(workers) +
                " worker ranks of this job (ranks - 1); lower it, or start more ranks");
  }
  if (p < 1 || d < 1 || p + d != workers) {
    throw Error("cluster.prefill_ranks = " + std::to_string(cfg.cluster.prefill_ranks) + " and cluster.decode_ranks = " +
                std::to_string(cfg.cluster.decode_ranks) + " do not split the " + std::to_string(workers) +
                " worker ranks of this job (ranks - 1); make them add up, or set only one of them");
  }
  if (cell > 0 && p % cell != 0)
    throw Error("cluster.prefill_ranks = " + std::to_string(p) + " is not whole cells of " + ranks_word(cell) +
                " (lcm of cluster.prefill_tp and cluster.decode_tp: under job.mode = \"auto\" each cell runs prefill "
                "or decode workers); make it a multiple of " + std::to_string(cell));
  check_whole("cluster.prefill_ranks", p, "cluster.prefill_tp (or tp)", a);
  check_whole("cluster.decode_ranks", d, "cluster.decode_tp (or tp)", b);
  return in_rank_order(p, d, a, b);
}

bool planned_job(const Config& cfg, const Roles& roles, int world_size) {
  return cfg.choices.mode == JobMode::kAuto && world_size > 2 && roles.workers() >= 2 &&
         (roles.prefill_tp == roles.decode_tp || roles.prefill > 0);
}

std::string tp_problem(const Prepared& p, const Roles& roles) {
  const Config& c = p.cfg;
  for (const auto& [key, width, used] : {std::tuple{"cluster.prefill_tp", roles.prefill_tp, roles.prefill > 0},
                                          std::tuple{"cluster.decode_tp", roles.decode_tp, true}}) {
    if (!used || width == 1) continue;
    if (const std::string why = runtime::cpu::tp_problem(p.model, width); !why.empty())
      return std::string(key) + " (or tp) = " + std::to_string(width) + ": " + why;
  }
  const int widest = std::max(roles.prefill > 0 ? roles.prefill_tp : 1, roles.decode_tp);
  if (widest == 1) return "";
  if (!c.choices.on_cpu()) {
    if (!mpi::optional_transport_built("nccl"))
      return "model.backend = \"" + c.model.backend + "\" runs a tensor-parallel group (cluster.tp > 1) over NCCL, and "
             "this tandem was built without it: rebuild with cmake -DTANDEM_NCCL=ON (NCCL beside CUDA), or set "
             "cluster.tp = 1";
    if (roles.prefill > 0 && roles.prefill_tp != roles.decode_tp && transport_for(c.choices, true) == TransportKind::kNccl)
      return "cluster.prefill_tp = " + std::to_string(roles.prefill_tp) + " and cluster.decode_tp = " +
             std::to_string(roles.decode_tp) + " differ, and transport.backend = \"nccl\" moves whole blocks, not "
             "the slices of them that a change of width needs: use transport.backend = \"mpi_two_sided\" (or "
             "\"auto\", which picks it), or set one width (cluster.tp)";
  }
  return "";
}

}  // namespace tandem::launcher
