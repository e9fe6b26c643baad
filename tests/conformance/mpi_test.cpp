// The conformance suite over the MPI backends, on real ranks:
//   mpirun -np 3 conformance_mpi rma|two_sided|two_sided_staged|libfabric [PROVIDER]
// two_sided_staged runs two-sided MPI over a pool it may reach only through
// DevicePool's copies, as a GPU's: the stand-in is memory the process cannot
// touch (PROT_NONE) except inside a copy, so a transport that reads or writes
// the pool directly crashes the test.
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>

#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_rma/mpi_rma_transport.h"
#include "mpi_transport/mpi_two_sided/mpi_two_sided_transport.h"
#include "mpi_transport/transport_registry.h"
#include "mpi_suite.h"
#include "relayout_suite.h"

namespace {

struct Guarded {
  uint8_t* base = nullptr;
  std::size_t bytes = 0;
  int64_t copies = 0, row_copies = 0, host_allocations = 0;

  // Opens the pages of [p, p + n) for the duration of one copy.
  void open(const void* p, std::size_t n, int prot) const {
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
    if (mprotect(reinterpret_cast<void*>(lo), hi - lo, prot) != 0) std::abort();
  }
  // `copies` counts the transport's, not the suite's.
  void copy(void* dst, const void* src, std::size_t n, bool to_pool, bool by_transport = true) {
    const void* pool_side = to_pool ? dst : src;
    open(pool_side, n, PROT_READ | PROT_WRITE);
    std::memcpy(dst, src, n);
    open(pool_side, n, PROT_NONE);
    copies += by_transport ? 1 : 0;
  }
  // `rows` rows of `width` bytes, `pitch` apart on the pool's side, packed on the host's.
  void copy_rows(void* dst, const void* src, std::size_t width, std::size_t rows, std::size_t pitch, bool to_pool) {
    const void* pool_side = to_pool ? dst : src;
    const std::size_t span = rows == 0 ? 0 : (rows - 1) * pitch + width;
    open(pool_side, span, PROT_READ | PROT_WRITE);
    for (std::size_t r = 0; r < rows; ++r) {
      if (to_pool) std::memcpy(static_cast<uint8_t*>(dst) + r * pitch, static_cast<const uint8_t*>(src) + r * width, width);
      else std::memcpy(static_cast<uint8_t*>(dst) + r * width, static_cast<const uint8_t*>(src) + r * pitch, width);
    }
    open(pool_side, span, PROT_NONE);
    ++row_copies;
  }
  // Whether the pool is closed to the process: reading it fails with EFAULT.
  bool closed() const {
    uint8_t byte = 0;
    iovec local{&byte, 1}, remote{base, 1};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) < 0 && errno == EFAULT;
  }
};

tandem::mpi::DevicePool guarded_pool(Guarded& g) {
  tandem::mpi::DevicePool d;
  d.allocate = [&g](std::size_t bytes) -> std::shared_ptr<void> {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    g.base = static_cast<uint8_t*>(p);
    g.bytes = bytes;
    return std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
  };
  d.copy = [&g](void* dst, const void* src, std::size_t n, bool to_pool) { g.copy(dst, src, n, to_pool); };
  d.copy_rows = [&g](void* dst, const void* src, std::size_t width, std::size_t rows, std::size_t pitch, bool to_pool) {
    g.copy_rows(dst, src, width, rows, pitch, to_pool);
  };
  d.allocate_host = [&g](std::size_t bytes) {
    ++g.host_allocations;
    return std::shared_ptr<void>(new uint8_t[bytes], [](void* p) { delete[] static_cast<uint8_t*>(p); });
  };
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::mpi::MpiEnv env(&argc, &argv);
  int failures = 0, checks = 0;
  const std::string mode = argc > 1 ? argv[1] : "rma";
  const std::string provider = argc > 2 ? argv[2] : "";  // libfabric's
  auto make = [&]() -> std::unique_ptr<tandem::mpi::KvTransport> {
    if (mode == "two_sided") return std::make_unique<tandem::mpi::MpiTwoSidedTransport>(env.world());
    if (mode == "libfabric") return tandem::mpi::make_optional_transport("libfabric", env.world(), provider);
    return std::make_unique<tandem::mpi::MpiRmaTransport>(env.world());
  };
  if (mode == "libfabric" && !tandem::mpi::optional_transport_built("libfabric")) {
    if (env.rank() == 0) std::printf("skipped: this build has no libfabric transport\n");
    return 77;
  }
  // Each backend twice: with the pool it allocates, then with memory the caller registers.
  for (const bool caller_memory : {false, true}) {
    Guarded guarded;
    std::unique_ptr<tandem::mpi::KvTransport> owned;
    tandem::conformance::PoolAccess access;
    if (mode == "two_sided_staged") {
      auto staged = std::make_unique<tandem::mpi::MpiTwoSidedTransport>(env.world(), guarded_pool(guarded));
      staged->set_max_message_bytes(5 * (4096 + 256));  // 5 of the suite's blocks: transfers span several messages
      owned = std::move(staged);
      // The suite too reaches the pool only through copies, and registers memory closed like a device's.
      access.write = [&](uint8_t* d, const void* s, std::size_t n) { guarded.copy(d, s, n, true, false); };
      access.read = [&](void* d, const uint8_t* s, std::size_t n) { guarded.copy(d, s, n, false, false); };
      access.allocate = [&](std::size_t n) { return guarded_pool(guarded).allocate(n); };
    } else {
      owned = make();
    }
    tandem::mpi::KvTransport& t = *owned;
    auto f = tandem::conformance::run_transport_suite_mpi(env.world(), t, access, caller_memory);
    if (mode == "two_sided_staged") {
      f.check(guarded.base != nullptr && guarded.closed(), "the stand-in device pool is closed to direct access");
      // Every rank sends or receives.
      f.check(guarded.copies > 0, "the pool was reached through DevicePool::copy");
      // Rank 1 sends 27 messages of at most 5 blocks (5 blocks, then the
      // 64-block pool twice); buffers come back as sends complete and are
      // reused (StagingBuffers::kKeep = 8 of them are kept).
      const auto& staged = static_cast<tandem::mpi::MpiTwoSidedTransport&>(t);
      if (t.rank() == 1 && t.size() > 2)
        f.check(staged.staging_allocations() <= 18 && guarded.host_allocations == staged.staging_allocations(),
                "staging buffers come from DevicePool::allocate_host and are recycled (rank 1: " +
                    std::to_string(staged.staging_allocations()) + " allocations for 27 messages)");
    }
    const auto [failed, checked] = tandem::conformance::gather_failures(env.world(), f);
    failures += failed;
    checks += checked;
  }
  // Pools of different block sizes, moved as row slices; then a pool cut anew into blocks of another size
  // (relayout). two_sided_staged: through the stand-in device's row copies.
  for (const bool relayout : {false, true}) {
    Guarded guarded;
    std::unique_ptr<tandem::mpi::KvTransport> t;
    if (mode == "two_sided_staged") t = std::make_unique<tandem::mpi::MpiTwoSidedTransport>(env.world(), guarded_pool(guarded));
    else t = make();
    tandem::conformance::PoolAccess access;
    if (mode == "two_sided_staged") {
      access.write = [&](uint8_t* d, const void* s, std::size_t n) { guarded.copy(d, s, n, true, false); };
      access.read = [&](void* d, const uint8_t* s, std::size_t n) { guarded.copy(d, s, n, false, false); };
    }
    auto f = relayout ? tandem::conformance::run_relayout_suite(*t, tandem::conformance::mpi_barrier(env.world()), access)
                      : tandem::conformance::run_slice_suite_mpi(env.world(), *t, access);
    const bool moves_slices = env.rank() == 0 || env.rank() == env.size() - 1 || (!relayout && env.rank() == 1);
    if (mode == "two_sided_staged" && moves_slices)
      f.check(guarded.row_copies > 0, "slices reached the stand-in device pool through DevicePool::copy_rows");
    const auto [failed, checked] = tandem::conformance::gather_failures(env.world(), f);
    failures += failed;
    checks += checked;
  }
  if (env.rank() == 0)
    std::printf("%s conformance: %d passed, %d failed\n",
                mode == "rma" ? "mpi_rma" : mode == "libfabric" ? ("libfabric " + provider).c_str() : ("mpi_" + mode).c_str(),
                checks - failures, failures);
  return env.rank() == 0 && failures > 0 ? 1 : 0;
}
