#include "launcher/run/job_checks.h"

#include <sys/sysinfo.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "router/input_file.h"
#include "launcher/run/transport_setup.h"
#include "mpi_transport/transport_registry.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/tp_group.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/model/weights.h"
#include "slurm/resumable_output.h"
#include "slurm/slurm_env.h"
#include "topology/cells.h"

namespace tandem::launcher {

// A run with defaults records them beside its output (<output>.defaults.json);
// a resumed run must bring the same ones, or its lines would be answered
// under two sets of defaults.
void check_defaults_record(const Prepared& p) {
  const std::string record = p.cfg.job.output + ".defaults.json";
  const std::string now = p.defaults ? p.defaults->canonical() : std::string();
  std::error_code ec;
  const bool continuing = p.cfg.job.resume && std::filesystem::exists(p.cfg.job.output) &&
                          std::filesystem::file_size(p.cfg.job.output, ec) > 0;
  if (continuing) {
    std::string before;
    if (std::ifstream in(record, std::ios::binary); in) {
      std::stringstream text;
      text << in.rdbuf();
      before = text.str();
      while (!before.empty() && before.back() == '\n') before.pop_back();
    }
    if (before != now)
      throw Error(p.cfg.job.output + ": its earlier run had " +
                  (before.empty() ? std::string("no defaults") : "other defaults (" + record + ")") + " than this one (" +
                  (now.empty() ? std::string("none") : p.cfg.defaults_source) +
                  "); resume it with the same [defaults] / --defaults, or start a new output");
    return;
  }
  if (now.empty()) {
    std::filesystem::remove(record, ec);  // a stale record of an output that is gone
    return;
  }
  std::ofstream out(record, std::ios::binary | std::ios::trunc);
  if (!(out << now << "\n")) throw Error(record + ": cannot write the defaults' record beside the output");
}

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
  check_defaults_record(p);
  runtime::ModelWeights::check(p.model, p.cfg.model.path);  // maps and checks every tensor; reads no weights
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

void use_cpu_matmul(const std::string& choice, const runtime::ModelConfig& m, const std::string& path,
                    const std::string& load_as) {
  if (choice == "bf16") runtime::cpu::use_kernels(runtime::cpu::MatmulMode::kBf16Dot);  // throws without AVX512-BF16
  if (choice == "bf16-amx") runtime::cpu::use_kernels(runtime::cpu::MatmulMode::kBf16Amx);
  if (choice != "int8") return;
  // "int8" multiplies INT8 weights with one scale per row (kernels.h's kInt8Dot).
  const runtime::QuantConfig& q = m.quant;
  using Method = runtime::QuantConfig::Method;
  const bool int8_rows = q.method == Method::kCompressedTensors && q.weight == runtime::DType::kI8 &&
                         q.block_cols == 0;  // a channel's or the tensor's scale
  if (!int8_rows && load_as != "int8")
    throw Error("model.cpu_matmul = \"int8\" multiplies INT8 weights with a scale per channel or tensor; " + path +
                " is " + (q.any() ? q.name() : std::string(runtime::dtype_name(m.dtype))) +
                ": " + (load_as.empty() ? "" : "quantize it as it loads (model.dtype = \"int8\"), ") +
                "write it with `tandem quantize --scheme int8-channel`, or use \"f32\"");
  for (const int64_t k : {m.hidden, m.intermediate, m.moe.intermediate, m.heads * m.head_dim})
    if (k > runtime::cpu::kInt8DotMaxCols)
      throw Error("model.cpu_matmul = \"int8\" keeps each product's sum in 32 bits, up to " +
                  std::to_string(runtime::cpu::kInt8DotMaxCols) + " columns; " + path + " has a product of " +
                  std::to_string(k) + ": use \"f32\"");
  runtime::cpu::use_kernels(runtime::cpu::MatmulMode::kInt8Dot);  // throws without AVX512-VNNI
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
  const std::string& as = p.cfg.model.dtype;
  if ((as == "fp8" || as == "int8") && p.model.quant.any())
    throw Error("model.dtype = \"" + as + "\": " + p.cfg.model.path + " is already quantized (" + p.model.quant.name() +
                "); use \"auto\"");
  if (as != "auto" && !c.on_cpu())
    throw Error("model.dtype = \"" + as + "\" converts the weights for the CPU backend; with model.backend = \"" + b +
                "\" the weights are computed in the checkpoint's dtype: remove it (or write the checkpoint you want with "
                "`tandem quantize`)");
  if (p.cfg.kv.dtype == "fp8" && p.model.head_dim % 4 != 0)
    throw Error("kv.dtype = \"fp8\" needs head_dim to be a multiple of 4 (each row's scale is an aligned float32); " +
                p.cfg.model.path + " has head_dim " + std::to_string(p.model.head_dim) + ": use \"bf16\"");
  if (p.cfg.model.gpu_matmul != "auto") {
    if (c.on_cpu())
      throw Error("model.gpu_matmul = \"" + p.cfg.model.gpu_matmul + "\" sets the CUDA backend's arithmetic; with "
                  "model.backend = \"" + b + "\" remove it");
    const runtime::QuantConfig& q = p.model.quant;
    if (q.method != runtime::QuantConfig::Method::kFp8Block || q.block_rows != 128 || q.block_cols != 128)
      throw Error("model.gpu_matmul = \"fp8\" multiplies checkpoints of FP8 weights in 128x128 blocks (DeepSeek and "
                  "Qwen -FP8 releases, tandem quantize --scheme fp8-block); " + p.cfg.model.path + " is " +
                  (q.any() ? q.name() : std::string(runtime::dtype_name(p.model.dtype))) + ": use \"auto\"");
  }
  if (c.on_cpu()) {
    if (c.transport == TransportKind::kNccl)
      throw Error("transport.backend = \"nccl\" moves KV between GPUs; it needs model.backend = \"cuda\"");
    use_cpu_matmul(p.cfg.model.cpu_matmul, p.model, p.cfg.model.path, p.cfg.model.dtype);
    return;
  }
  if (p.cfg.model.cpu_matmul != "f32")
    throw Error("model.cpu_matmul = \"" + p.cfg.model.cpu_matmul + "\" sets the CPU backend's arithmetic; with model.backend = \"" +
                b + "\" remove it");
  if (const std::string why = runtime::backend_unavailable(b); !why.empty())
    throw Error("model.backend = \"" + b + "\": " + why + "; use \"cpu\" or run where a GPU is visible");
  if (const std::string why = runtime::backend_model_problem(b, p.model); !why.empty())
    throw Error("model.backend = \"" + b + "\" " + why);
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

int64_t kv_elem_bytes(const std::string& d, bool on_cpu, const std::string& cpu_matmul, const runtime::ModelConfig& m) {
  if (d == "fp8") return 1;
  if (d == "bf16") return 2;
  if (d != "auto") return 4;
  if (!on_cpu) return m.dtype != runtime::DType::kF32 ? 2 : 4;
  return cpu_matmul == "bf16-amx" && m.head_dim % 2 == 0 ? 2 : 4;
}

kv::KvLayout kv_layout(const Prepared& p, int tp) {
  const int64_t kv_heads = runtime::cpu::shard_config(p.model, {0, tp}).kv_heads;
  kv::KvLayout l{p.model.layers, kv_heads, p.model.head_dim, p.cfg.kv.block_size};
  l.elem_bytes = kv_elem_bytes(p.cfg.kv.dtype, p.cfg.choices.on_cpu(), p.cfg.model.cpu_matmul, p.model);
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
  // A MoE layer's (CudaModel::size_moe): its float32 input, the router's logits, each row's experts and
  // weights (and their order), gate|up and the output of each of its top_k slots; a group gathers the slots.
  const double k = static_cast<double>(std::max<int64_t>(1, m.moe.top_k));
  const double moe = m.moe.any() ? static_cast<double>(m.hidden + m.moe.experts) + 3 * k +
                                       k * static_cast<double>(2 * m.moe.intermediate + m.hidden)
                                 : 0.0;
  const double step = rows * (widths + moe) * 4 + static_cast<double>(p.cfg.job.max_num_seqs * m.vocab) * 4 +
                      (tp > 1 ? rows * static_cast<double>(m.hidden * tp) * k * 4 : 0.0);  // a group's gathered sums
                                                                                          // (a MoE layer's: of every slot)
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
    // An 8-bit checkpoint's weights stay 8-bit on the device, each row with a float32 scale for each block
    // of columns it crosses (one more where a rank's columns start inside a block): 4 / block_cols of the
    // codes, and 4 bytes a row for the first block's.
    if (p.model.quant.any()) {
      const double block_cols = static_cast<double>(p.model.quant.block_cols > 0 ? p.model.quant.block_cols : p.model.hidden);
      weights += weights * 4 / block_cols + 4.0 * static_cast<double>(p.model.layers) *
                                               static_cast<double>(4 * p.model.hidden + 3 * p.model.intermediate);
    }
    double free = static_cast<double>(runtime::backend_free_bytes(p.cfg.model.backend));
    if (p.model.quant.any())  // a long product's weights as bf16, a tile at a time, and its input rounded to bf16
      free -= static_cast<double>(runtime::kDequantTileBytes) +   // (CudaModel::dequantized_gemm)
              2.0 * static_cast<double>(p.cfg.job.max_batched_tokens) *
                  static_cast<double>(std::max({p.model.hidden, p.model.heads * p.model.head_dim, p.model.intermediate}));
    return {want, device_pool_room(p, weights, free, tp)};
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

uint64_t cell_pool_bytes(const Prepared& p, int local_ranks, int tp_a, int tp_b) {
  const PoolRoom a = pool_room(p, local_ranks, tp_a), b = pool_room(p, local_ranks, tp_b);
  return topology::cell_pool_bytes(a.want, a.room, b.want, b.room, kv_layout(p, tp_a).block_bytes(), kv_layout(p, tp_b).block_bytes());
}

topology::Ask split_ask(const Config& cfg) {
  const JobMode m = cfg.choices.mode;
  return {m == JobMode::kAgg ? topology::Mode::kAgg : m == JobMode::kAuto ? topology::Mode::kAuto : topology::Mode::kDisagg,
          {cfg.cluster.prefill_width(), cfg.cluster.decode_width()},
          {cfg.cluster.prefill_ranks, cfg.cluster.decode_ranks},
          cfg.cluster.prefill_fraction};
}

std::string tp_problem(const Prepared& p, const topology::Roles& roles) {
  using topology::Side;
  const Config& c = p.cfg;
  const int prefill_tp = roles.width(Side::kPrefill), decode_tp = roles.width(Side::kDecode);
  for (const auto& [key, width, used] : {std::tuple{"cluster.prefill_tp", prefill_tp, roles.disaggregated()},
                                          std::tuple{"cluster.decode_tp", decode_tp, true}}) {
    if (!used || width == 1) continue;
    if (const std::string why = runtime::cpu::tp_problem(p.model, width, c.cluster.expert_parallel); !why.empty())
      return std::string(key) + " (or tp) = " + std::to_string(width) + ": " + why;
  }
  const int widest = std::max(roles.disaggregated() ? prefill_tp : 1, decode_tp);
  if (widest == 1) return "";
  if (!c.choices.on_cpu()) {
    if (!mpi::optional_transport_built("nccl"))
      return "model.backend = \"" + c.model.backend + "\" runs a tensor-parallel group (cluster.tp > 1) over NCCL, and "
             "this tandem was built without it: rebuild with cmake -DTANDEM_NCCL=ON (NCCL beside CUDA), or set "
             "cluster.tp = 1";
    if (roles.disaggregated() && prefill_tp != decode_tp && transport_for(c.choices, true) == TransportKind::kNccl)
      return "cluster.prefill_tp = " + std::to_string(prefill_tp) + " and cluster.decode_tp = " +
             std::to_string(decode_tp) + " differ, and transport.backend = \"nccl\" moves whole blocks, not "
             "the slices of them that a change of width needs: use transport.backend = \"mpi_two_sided\" (or "
             "\"auto\", which picks it), or set one width (cluster.tp)";
  }
  return "";
}

}  // namespace tandem::launcher
