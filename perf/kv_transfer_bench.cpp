// KV block transfer bandwidth through the KvTransport (MPI RMA backend) next
// to a raw MPI_Put + MPI_Win_flush of the same bytes and a memcpy, in one run.
//   mpirun -np 2 kv_transfer_bench [MAX_MIB]
// Rank 0 sends, rank 1 owns the target pool. Sizes 64 KiB .. 256 MiB; median
// of several repetitions. Prints GB/s and the transport / raw ratio; never
// fails on time.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_rma/mpi_rma_transport.h"

using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  tandem::mpi::MpiEnv env(&argc, &argv);
  if (env.size() != 2) {
    if (env.rank() == 0) std::fprintf(stderr, "kv_transfer_bench: run with mpirun -np 2\n");
    return 2;
  }
  const std::size_t max_bytes = static_cast<std::size_t>(argc > 1 ? std::atoi(argv[1]) : 256) << 20;
  // Blocks of the bench model: 28 layers x K,V x 16 tokens x 8 kv heads x 128 dims x float = 3.5 MiB;
  // smaller transfers use 64 KiB blocks so that every size is a whole number of blocks.
  const std::size_t block = 64 << 10;
  const int64_t n_blocks = static_cast<int64_t>(max_bytes / block);

  tandem::mpi::MpiRmaTransport transport(env.world());
  void* base = nullptr;
  if (!transport.create_pool(block, n_blocks, &base).ok()) return 3;
  std::memset(base, env.rank() + 1, block * static_cast<std::size_t>(n_blocks));

  MPI_Win raw;
  void* raw_base = nullptr;
  MPI_Win_allocate(static_cast<MPI_Aint>(max_bytes), 1, MPI_INFO_NULL, env.world(), &raw_base, &raw);
  std::memset(raw_base, 7, max_bytes);
  MPI_Win_lock_all(MPI_MODE_NOCHECK, raw);
  std::vector<char> src(max_bytes, 3), dst(max_bytes, 0);

  if (env.rank() == 0) {
    std::printf("%10s %14s %14s %14s %10s\n", "size", "transport GB/s", "MPI_Put GB/s", "memcpy GB/s", "ratio");
  }
  for (std::size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
    const int reps = bytes <= (4u << 20) ? 50 : bytes <= (64u << 20) ? 12 : 8;
    std::vector<double> t_transport, t_raw, t_copy;
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(env.world());
      if (env.rank() == 0) {
        const auto nb = static_cast<int32_t>(bytes / block);
        std::vector<int32_t> ids(static_cast<std::size_t>(nb));
        std::iota(ids.begin(), ids.end(), 0);
        auto via_transport = [&] {
          const auto t0 = Clock::now();
          tandem::mpi::Transfer x;
          if (!transport.post(1, ids, ids, x).ok()) return false;
          while (!x.done)
            if (!transport.test(x).ok()) return false;
          t_transport.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          return true;
        };
        auto via_raw = [&] {
          const auto t0 = Clock::now();
          MPI_Put(raw_base, static_cast<int>(bytes), MPI_BYTE, 1, 0, static_cast<int>(bytes), MPI_BYTE, raw);
          MPI_Win_flush(1, raw);
          t_raw.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        };
        // Alternate which goes first, so neither always meets a warm or cold cache.
        if (r % 2 == 0) {
          if (!via_transport()) return 3;
          via_raw();
        } else {
          via_raw();
          if (!via_transport()) return 3;
        }
        auto t0 = Clock::now();
        std::memcpy(dst.data(), src.data(), bytes);
        t_copy.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    if (env.rank() == 0) {
      const double gb = static_cast<double>(bytes) / 1e9;
      const double a = gb / median(t_transport), b = gb / median(t_raw), c = gb / median(t_copy);
      char size[32];
      if (bytes >= (1u << 20)) std::snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
      else std::snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
      std::printf("%10s %14.2f %14.2f %14.2f %9.0f%%\n", size, a, b, c, 100.0 * a / b);
      std::fflush(stdout);
    }
  }
  MPI_Win_unlock_all(raw);
  MPI_Win_free(&raw);
  (void)transport.destroy();
  if (env.rank() == 0) std::printf("ratio = transport / raw MPI_Put of the same bytes (target: >= 90%% from 1 MiB)\n");
  return 0;
}
