// KV block transfer bandwidth through the KvTransport interface (post with a
// notification, poll until done) for the MPI RMA and two-sided backends, in
// one run next to:
//  - the old transport (before it carried notifications), replayed: its
//    post() (checks, runs of blocks, an MPI_Put each), its test()
//    (MPI_Win_flush), then the worker's separate ready message through the
//    mailbox (a queued MPI_Isend, the queue tested), as the code did;
//  - the bare floor of that path: MPI_Put + MPI_Win_flush + MPI_Isend/Wait;
//  - a memcpy.
// The old and bare paths put on the RMA transport's own window, between the
// same addresses: which memory a copy touches moves the figures by more than
// the paths differ (a separate window moved the ratio by up to 15% either
// way, with the order the windows were allocated in).
//   mpirun -np 2 kv_transfer_bench [MAX_MIB]
// Rank 0 sends, rank 1 owns the target pools (and keeps receiving the
// notifications while it waits). Sizes 64 KiB .. MAX_MIB (256); median of
// many repetitions (1,000 at the small sizes), the three RMA paths taking
// turns at going first. Prints GB/s and the RMA transport against the old
// one and against the floor; never fails on time.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <numeric>
#include <span>
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

// The transport before v2 on the same window (see the top): what a prefill
// rank did per KV handoff.
class OldPath {
 public:
  OldPath(MPI_Win win, uint8_t* base, std::size_t block, int64_t n_blocks, MPI_Comm ready)
      : win_(win), base_(base), block_(block), n_blocks_(n_blocks), ready_(ready) {}
  bool transfer(std::span<const int32_t> src, std::span<const int32_t> dst, std::vector<uint8_t> ready_msg) {
    // post()
    if (!tandem::mpi::check_post(1, 2, src, dst, n_blocks_, n_blocks_).ok()) return false;
    for (const auto& r : tandem::mpi::coalesce(src, dst)) {
      const int n = static_cast<int>(static_cast<std::size_t>(r.count) * block_);
      if (MPI_Put(base_ + static_cast<std::size_t>(r.src) * block_, n, MPI_BYTE, 1,
                  static_cast<MPI_Aint>(static_cast<std::size_t>(r.dst) * block_), n, MPI_BYTE, win_) != MPI_SUCCESS)
        return false;
    }
    // test()
    if (MPI_Win_flush(1, win_) != MPI_SUCCESS) return false;
    // Mailbox::send() of the ready message, then its progress()
    pending_.emplace_back(MPI_REQUEST_NULL, std::move(ready_msg));
    auto& [request, bytes] = pending_.back();
    if (MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 1, 0, ready_, &request) != MPI_SUCCESS) return false;
    while (!pending_.empty()) {
      int done = 0;
      MPI_Test(&pending_.front().first, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      pending_.pop_front();
    }
    return true;
  }
  void finish() {
    for (auto& [request, bytes] : pending_) MPI_Wait(&request, MPI_STATUS_IGNORE);
    pending_.clear();
  }

 private:
  MPI_Win win_;
  uint8_t* base_;
  std::size_t block_;
  int64_t n_blocks_;
  MPI_Comm ready_;
  std::deque<std::pair<MPI_Request, std::vector<uint8_t>>> pending_;
};

struct Times {
  std::vector<double> rma, old, raw, two, copy;
};

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One size's row: GB/s of each path, the RMA transport against the old one and the floor, and the RMA paths' times.
void print_row(std::size_t bytes, const Times& t) {
  const double gb = static_cast<double>(bytes) / 1e9;
  const double a = gb / median(t.rma), o = gb / median(t.old), b = gb / median(t.raw);
  char size[32];
  if (bytes >= (1u << 20)) std::snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
  else std::snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
  std::printf("%9s %9.2f %9.2f %9.2f %9.2f %9.2f %8.0f%% %8.0f%% %10.2f/%.2f/%.2f\n", size, a, o, b,
              gb / median(t.two), gb / median(t.copy), 100.0 * a / o, 100.0 * a / b, 1e6 * median(t.rma),
              1e6 * median(t.old), 1e6 * median(t.raw));
  std::fflush(stdout);
}

// What rank 0's paths need.
struct Paths {
  std::size_t block;
  tandem::mpi::MpiRmaTransport& rma;
  void* rma_base;
  OldPath& old;
  MPI_Comm ready;
  const std::vector<uint8_t>& notification;
  std::vector<char> src, dst;  // the memcpy's
};

// Rank 0's turn at one repetition of the three RMA paths (`first` goes first) and a memcpy.
bool rma_paths(int first, std::size_t bytes, Paths& p, Times& t) {
  auto& [block, rma, rma_base, old, ready, notification, src, dst] = p;
  std::vector<int32_t> ids(bytes / block);
  std::iota(ids.begin(), ids.end(), 0);
  auto via_transport = [&] {
    const auto t0 = Clock::now();
    tandem::mpi::XferId id = 0;
    if (!rma.post(1, ids, ids, notification, id).ok()) return false;
    for (tandem::mpi::XferState st = tandem::mpi::XferState::kPending; st == tandem::mpi::XferState::kPending;)
      if (!rma.poll(id, st).ok()) return false;
    t.rma.push_back(since(t0));
    rma.release(id);
    return true;
  };
  auto via_old = [&] {
    std::vector<uint8_t> ready_msg = notification;  // encoded before the handoff, as the notification is
    const auto t0 = Clock::now();
    if (!old.transfer(ids, ids, std::move(ready_msg))) return false;
    t.old.push_back(since(t0));
    return true;
  };
  auto via_raw = [&] {
    const auto t0 = Clock::now();
    const int n = static_cast<int>(bytes);
    if (MPI_Put(rma_base, n, MPI_BYTE, 1, 0, n, MPI_BYTE, rma.window()) != MPI_SUCCESS) return false;
    MPI_Win_flush(1, rma.window());
    MPI_Request sent;
    MPI_Isend(notification.data(), static_cast<int>(notification.size()), MPI_BYTE, 1, 0, ready, &sent);
    MPI_Wait(&sent, MPI_STATUS_IGNORE);
    t.raw.push_back(since(t0));
    return true;
  };
  for (int k = 0; k < 3; ++k) {
    const int which = (first + k) % 3;
    if (!(which == 0 ? via_transport() : which == 1 ? via_old() : via_raw())) return false;
  }
  const auto t0 = Clock::now();
  std::memcpy(dst.data(), src.data(), bytes);
  t.copy.push_back(since(t0));
  return true;
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

  OldPath old(rma.window(), static_cast<uint8_t*>(rma_base), block, n_blocks, ready);
  const std::vector<uint8_t> notification(24, 1);  // about what a KV handoff's first token and counters take
  Paths paths{block, rma, rma_base, old, ready, notification, std::vector<char>(max_bytes, 3), std::vector<char>(max_bytes, 0)};

  if (env.rank() == 0)
    std::printf("%9s %9s %9s %9s %9s %9s %9s %9s %s\n", "size", "rma GB/s", "old GB/s", "floor", "2-sided",
                "memcpy", "rma/old", "rma/floor", "us: rma/old/floor");
  for (std::size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
    // Small transfers take microseconds and a median of 50 moved by +-5%: many more of them, still ~0.1 s a size.
    const int reps = bytes <= (256u << 10) ? 1000 : bytes <= (1u << 20) ? 200 : bytes <= (4u << 20) ? 50 : bytes <= (64u << 20) ? 12 : 8;
    Times t;
    for (int r = 0; r < reps; ++r) {
      barrier(env.world(), ready, transports);
      if (env.rank() == 0 && !rma_paths(r % 3, bytes, paths, t)) return 3;
      // Two-sided needs the target in its progress loop: a barrier of its own around each transfer.
      barrier(env.world(), ready, transports);
      if (env.rank() == 0) {
        std::vector<int32_t> ids(bytes / block);
        std::iota(ids.begin(), ids.end(), 0);
        const auto t0 = Clock::now();
        tandem::mpi::XferId id = 0;
        if (!two.post(1, ids, ids, notification, id).ok()) return 3;
        for (tandem::mpi::XferState st = tandem::mpi::XferState::kPending; st == tandem::mpi::XferState::kPending;)
          if (!two.poll(id, st).ok()) return 3;
        t.two.push_back(since(t0));
        two.release(id);
      }
    }
    if (env.rank() == 0) print_row(bytes, t);
  }
  old.finish();
  barrier(env.world(), ready, transports);
  MPI_Comm_free(&ready);
  (void)rma.destroy();
  (void)two.destroy();
  if (env.rank() == 0)
    std::printf("rma/old = the RMA transport (post with a notification, poll to done) / the old transport replayed\n"
                "(post, test, then the ready message; target: >= 100%% from 64 KiB); rma/floor = against a bare\n"
                "MPI_Put + MPI_Win_flush + MPI_Isend/Wait of the same bytes, same window; us: a transfer's median time\n");
  return 0;
}
