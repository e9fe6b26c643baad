// KV block transfer bandwidth through the KvTransport interface (post with a
// notification, poll until done) for the MPI RMA and two-sided backends,
// next to a raw MPI_Put + MPI_Win_flush of the same bytes (what the
// transport did before it carried notifications: the data, then the ready
// message sent separately once the flush returned) and a memcpy, in one run.
// The raw path puts on the RMA transport's own window, between the same
// addresses: which memory a copy touches moves the figures by more than the
// paths differ (a separate window moved the ratio by up to 15% either way,
// with the order the windows were allocated in).
//   mpirun -np 2 kv_transfer_bench [MAX_MIB]
// Rank 0 sends, rank 1 owns the target pools (and keeps receiving the
// notifications while it waits). Sizes 64 KiB .. MAX_MIB (256); median of
// many repetitions (1,000 at the small sizes). Prints GB/s and the RMA
// transport / raw ratio; never fails on time.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_rma/mpi_rma_transport.h"
#include "mpi_transport/mpi_two_sided/mpi_two_sided_transport.h"

using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A barrier during which this rank keeps driving the transports (a two-sided
// target places blocks only then) and drops the notifications and the raw
// path's ready messages that arrive.
void barrier(MPI_Comm world, MPI_Comm ready, const std::vector<tandem::mpi::KvTransport*>& ts) {
  MPI_Request r;
  MPI_Ibarrier(world, &r);
  std::vector<tandem::mpi::Notification> dropped;
  for (int done = 0; !done;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    for (auto* t : ts) (void)t->progress(dropped);
    dropped.clear();
    for (int flag = 1; flag;) {
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, 0, ready, &flag, &st);
      if (!flag) break;
      char msg[64];
      MPI_Recv(msg, sizeof msg, MPI_BYTE, st.MPI_SOURCE, 0, ready, MPI_STATUS_IGNORE);
    }
  }
}

// One size's row: GB/s of each path, the RMA transport against the raw path, and the time in the starting calls.
void print_row(std::size_t bytes, const std::vector<double>& t_rma, const std::vector<double>& t_two,
               const std::vector<double>& t_raw, const std::vector<double>& t_copy, const std::vector<double>& post_t,
               const std::vector<double>& put_t) {
  const double gb = static_cast<double>(bytes) / 1e9;
  const double a = gb / median(t_rma), w = gb / median(t_two), b = gb / median(t_raw), c = gb / median(t_copy);
  char size[32];
  if (bytes >= (1u << 20)) std::snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
  else std::snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
  std::printf("%10s %12.2f %12.2f %14.2f %12.2f %7.0f%% %9.2f/%-9.2f %8.2f/%.2f\n", size, a, w, b, c, 100.0 * a / b,
              1e6 * median(post_t), 1e6 * median(t_rma), 1e6 * median(put_t), 1e6 * median(t_raw));
  std::fflush(stdout);
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

  tandem::mpi::MpiRmaTransport rma(env.world());
  tandem::mpi::MpiTwoSidedTransport two(env.world());
  void* rma_base = nullptr;
  void* two_base = nullptr;
  if (!rma.allocate_pool(block, n_blocks, &rma_base).ok() || !two.allocate_pool(block, n_blocks, &two_base).ok()) return 3;
  MPI_Comm ready;
  MPI_Comm_dup(env.world(), &ready);
  std::memset(rma_base, env.rank() + 1, max_bytes);
  std::memset(two_base, env.rank() + 1, max_bytes);
  const std::vector<tandem::mpi::KvTransport*> transports = {&rma, &two};

  std::vector<char> src(max_bytes, 3), dst(max_bytes, 0);

  if (env.rank() == 0)
    std::printf("%10s %12s %12s %14s %12s %8s %19s %s\n", "size", "rma GB/s", "2-sided GB/s", "Put+msg GB/s", "memcpy GB/s",
                "rma/old", "rma post/all us", "Put/all us");
  const std::vector<uint8_t> notification(24, 1);  // about what a KV handoff's first token and counters take
  for (std::size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
    // Small transfers take microseconds and a median of 50 moved by +-5%: many more of them, still ~0.1 s a size.
    const int reps = bytes <= (256u << 10) ? 1000 : bytes <= (1u << 20) ? 200 : bytes <= (4u << 20) ? 50 : bytes <= (64u << 20) ? 12 : 8;
    std::vector<double> t_rma, t_two, t_raw, t_copy, post_t, put_t;
    for (int r = 0; r < reps; ++r) {
      barrier(env.world(), ready, transports);
      if (env.rank() == 0) {
        const auto nb = static_cast<int32_t>(bytes / block);
        std::vector<int32_t> ids(static_cast<std::size_t>(nb));
        std::iota(ids.begin(), ids.end(), 0);
        auto via = [&](tandem::mpi::KvTransport& t, std::vector<double>& times) {
          const auto t0 = Clock::now();
          tandem::mpi::XferId id = 0;
          if (!t.post(1, ids, ids, notification, id).ok()) return false;
          if (&t == &rma) post_t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          for (tandem::mpi::XferState st = tandem::mpi::XferState::kPending; st == tandem::mpi::XferState::kPending;)
            if (!t.poll(id, st).ok()) return false;
          times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          t.release(id);
          return true;
        };
        auto via_raw = [&] {  // the old path: put, flush (remote completion), then the ready message
          const auto t0 = Clock::now();
          MPI_Put(rma_base, static_cast<int>(bytes), MPI_BYTE, 1, 0, static_cast<int>(bytes), MPI_BYTE, rma.window());
          put_t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          MPI_Win_flush(1, rma.window());
          MPI_Request sent;
          MPI_Isend(notification.data(), static_cast<int>(notification.size()), MPI_BYTE, 1, 0, ready, &sent);
          MPI_Wait(&sent, MPI_STATUS_IGNORE);
          t_raw.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        };
        // Alternate which goes first, so neither always meets a warm or cold cache.
        if (r % 2 == 0) {
          if (!via(rma, t_rma)) return 3;
          via_raw();
        } else {
          via_raw();
          if (!via(rma, t_rma)) return 3;
        }
        auto t0 = Clock::now();
        std::memcpy(dst.data(), src.data(), bytes);
        t_copy.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      // Two-sided needs the target in its progress loop: a barrier of its own around each transfer.
      barrier(env.world(), ready, transports);
      if (env.rank() == 0) {
        const auto nb = static_cast<int32_t>(bytes / block);
        std::vector<int32_t> ids(static_cast<std::size_t>(nb));
        std::iota(ids.begin(), ids.end(), 0);
        const auto t0 = Clock::now();
        tandem::mpi::XferId id = 0;
        if (!two.post(1, ids, ids, notification, id).ok()) return 3;
        for (tandem::mpi::XferState st = tandem::mpi::XferState::kPending; st == tandem::mpi::XferState::kPending;)
          if (!two.poll(id, st).ok()) return 3;
        t_two.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        two.release(id);
      }
    }
    if (env.rank() == 0) print_row(bytes, t_rma, t_two, t_raw, t_copy, post_t, put_t);
  }
  barrier(env.world(), ready, transports);
  MPI_Comm_free(&ready);
  (void)rma.destroy();
  (void)two.destroy();
  if (env.rank() == 0)
    std::printf("rma/old = the RMA transport (post with a notification, poll to done) / the path before notifications:\n"
                "MPI_Put + MPI_Win_flush of the same bytes on the same window, then a ready message\n"
                "(target: >= 100%% from 64 KiB). post/all, Put/all: time in the call that starts the\n"
                "transfer (over shared memory the copy happens there) against the whole transfer\n");
  return 0;
}
