#include "launcher/run/job_checks.h"

#include <sys/sysinfo.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "router/input_file.h"
#include "launcher/run/transport_setup.h"
#include "mpi_transport/transport_registry.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/model/weights.h"
#include "slurm/resumable_output.h"
#include "slurm/slurm_env.h"

namespace tandem::launcher {

void check_files(const Prepared& p) {
  if (const std::string busy = slurm::output_in_use(p.cfg.job.output); !busy.empty()) throw Error(busy);
  if (const auto recorded = slurm::recorded_shard(p.cfg.job.output)) {  // an array task's output: the same share
    const auto env = slurm::SlurmEnv::from_environment();
    (void)slurm::continue_shard(*recorded, {env.array_task_id, env.shard_index(), env.shard_count()}, p.cfg.job.output);
  }
  if (std::filesystem::is_directory(p.cfg.job.input))
    throw Error(p.cfg.job.input + ": is a directory, not a JSONL file; check job.input or --input");
  // Readable, and text (plain, gzip or zstd): anything else stops here, saying what it looks like.
  (void)router::InputFile(p.cfg.job.input, p.max_line_bytes);
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
}

void check_backend(const Prepared& p, int ranks) {
  const std::string& b = p.cfg.model.backend;
  const Choices& c = p.cfg.choices;
  if (c.transport == TransportKind::kLibfabric)
    throw Error("transport.backend = \"libfabric\" is not available yet; use \"auto\" (MPI one-sided windows, or "
                "NCCL between GPUs, which reaches EFA through its plugin)");
  if (c.on_cpu()) {
    if (c.transport == TransportKind::kNccl)
      throw Error("transport.backend = \"nccl\" moves KV between GPUs; it needs model.backend = \"cuda\"");
    return;
  }
  if (const std::string why = runtime::backend_unavailable(b); !why.empty())
    throw Error("model.backend = \"" + b + "\": " + why + "; use \"cpu\" or run where a GPU is visible");
  const bool disaggregated = ranks > 2 && c.mode != JobMode::kAgg;
  const TransportKind t = transport_for(c);
  if (!disaggregated) return;
  if (t == TransportKind::kNccl && !mpi::optional_transport_built("nccl"))
    throw Error("transport.backend = \"nccl\": this tandem was built without NCCL (cmake -DTANDEM_NCCL=ON); use "
                "\"mpi_two_sided\" or \"auto\" (two-sided MPI through host memory)");
  if (t != TransportKind::kNccl && t != TransportKind::kMpiTwoSided)
    throw Error(std::string("transport.backend = \"") + transport_name(t) + "\" exposes host memory, not the GPU's KV pool; with model.backend = \"" +
                b + "\" use \"nccl\", \"mpi_two_sided\" (staged through host memory) or \"auto\"");
}

kv::KvLayout kv_layout(const Prepared& p) {
  kv::KvLayout l{p.model.layers, p.model.kv_heads, p.model.head_dim, p.cfg.kv.block_size};
  const std::string& d = p.cfg.kv.dtype;
  const bool bf16 = d == "bf16" || (d == "auto" && !p.cfg.choices.on_cpu() && p.model.dtype != runtime::DType::kF32);
  l.elem_bytes = bf16 ? 2 : 4;
  return l;
}

int64_t pool_blocks(const Prepared& p, int local_ranks) {
  const kv::KvLayout layout = kv_layout(p);
  const double block = static_cast<double>(layout.block_bytes());
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
    return std::max<int64_t>(1, static_cast<int64_t>(p.cfg.kv.memory_gib * (1 << 30) / block));
  }
  const int64_t want = p.cfg.job.max_num_seqs * ((p.max_model_len + p.cfg.kv.block_size - 1) / p.cfg.kv.block_size);
  if (!p.cfg.choices.on_cpu()) {  // the device's free memory less the weights (not yet loaded), a step and 1 GiB; 90%
    double weights = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(p.cfg.model.path, ec))
      if (e.path().extension() == ".safetensors") weights += static_cast<double>(e.file_size(ec));
    // Left for a step's buffers (activations, the rounded GEMM input, logits of every sequence), NCCL and cuBLAS.
    const auto& m = p.model;
    const double rows = static_cast<double>(p.cfg.job.max_batched_tokens);
    // x, y, last; qkv, q, attn; gate/up; the rounded product input (float32 at most) — as CudaModel::launch.
    const double widths = static_cast<double>(3 * m.hidden + 3 * m.heads * m.head_dim + 2 * m.kv_heads * m.head_dim +
                                              2 * m.intermediate +
                                              std::max({m.hidden, m.heads * m.head_dim, m.intermediate}));
    const double step = rows * widths * 4 + static_cast<double>(p.cfg.job.max_num_seqs * m.vocab) * 4;
    const double free = static_cast<double>(runtime::backend_free_bytes(p.cfg.model.backend)) - weights - step -
                        static_cast<double>(1 << 30);
    return std::max<int64_t>(1, std::min<int64_t>(want, static_cast<int64_t>(0.9 * free / block)));
  }
  struct sysinfo si {};
  sysinfo(&si);
  const double avail = static_cast<double>(si.freeram + si.bufferram) * si.mem_unit * 0.6 / std::max(1, local_ranks);
  return std::max<int64_t>(1, std::min<int64_t>(want, static_cast<int64_t>(avail / block)));
}

Roles plan_roles(const Config& cfg, int world_size) {
  const int workers = std::max(1, world_size - 1);
  Roles r{0, workers};
  if (cfg.choices.mode == JobMode::kAgg || world_size <= 2) return r;  // one worker cannot be split
  int p = static_cast<int>(cfg.cluster.prefill_ranks);
  int d = static_cast<int>(cfg.cluster.decode_ranks);
  if (p == 0 && d == 0) p = std::clamp(static_cast<int>(cfg.cluster.prefill_fraction * workers + 0.5), 1, workers - 1);
  else if (p == 0) p = workers - d;
  else if (d == 0) d = workers - p;
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
  return {p, d};
}

}  // namespace tandem::launcher
