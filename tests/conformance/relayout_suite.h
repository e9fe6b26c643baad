// A pool seen anew (KvTransport::relayout): tensor-parallel workers that
// change width between epochs keep their pool's memory and cut it into
// blocks of another size. The last rank's pool of 16 blocks of two KV heads
// a row becomes 32 blocks of one head a row: rank 0 then moves one head of
// its blocks into blocks that only the new layout has (row slices), and once
// the pool is back to its first layout, whole blocks. A layout larger than
// the pool, or of no peer, is refused. Needs 2 ranks or more.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "transport_suite.h"

namespace tandem::conformance {

inline Failures run_relayout_suite(mpi::KvTransport& t, const Barrier& barrier, const PoolAccess& a = {}) {
  Failures f;
  const int me = t.rank(), last = t.size() - 1;
  constexpr int64_t kRows = 4, kBlocks = 16;
  constexpr std::size_t kHead = 12, kWide = kRows * 2 * kHead, kNarrow = kRows * kHead;  // block bytes: 96, then 48
  void* base = nullptr;
  f.check(t.allocate_pool(kWide, kBlocks, &base).ok(), "relayout: allocate_pool");
  auto* pool = static_cast<uint8_t*>(base);
  Driver drive{t, f, "relayout", {}};
  std::vector<mpi::Notification>& inbox = drive.inbox;
  auto pump = [&] { drive.pump(); };
  auto wait = [&](mpi::XferId id, const std::string& what) { drive.wait(id, what); };
  auto arrive = [&](std::size_t n) {
    for (long i = 0; i < 20000000 && inbox.size() < n; ++i) pump();
    f.check(inbox.size() == n, "relayout: " + std::to_string(n) + " notification(s), got " + std::to_string(inbox.size()));
    inbox.clear();
  };
  if (me == 0)
    for (int32_t b = 0; b < kBlocks; ++b) fill(a, pool, kWide, b, 0, 9);
  barrier([&] { pump(); });  // every pool is set up (loopback's endpoints are threads)
  // Every rank sees the last rank's pool anew (the last rank its own).
  f.check(t.relayout(last, kNarrow, 2 * kBlocks).ok(), "relayout: to 32 blocks of one head a row");
  f.check(!t.relayout(last, kNarrow, 2 * kBlocks + 1).ok(), "relayout: more blocks than the pool holds: refused");
  f.check(!t.relayout(t.size(), kNarrow, 1).ok(), "relayout: no such peer: refused");
  barrier([&] { pump(); });
  const std::vector<int32_t> src{2, 3}, dst{20, 31};  // 20 and 31: only in the new layout
  if (me == 0) {
    mpi::XferId x = 0;
    f.check(t.post_slice(last, src, dst, {kRows, kHead, 0, kHead}, note("head 1"), x).ok(), "relayout: post a slice");
    wait(x, "relayout: slice");
  }
  if (me == last) {
    arrive(1);
    bool ok = true;  // each row of the narrow block: head 1 of rank 0's row
    std::vector<uint8_t> got(kNarrow);
    for (std::size_t i = 0; i < dst.size(); ++i) {
      a.read(got.data(), pool + static_cast<std::size_t>(dst[i]) * kNarrow, kNarrow);
      const auto sent = pattern(kWide, src[i], 0, 9);
      for (int64_t r = 0; r < kRows; ++r)
        ok = ok && std::memcmp(&got[static_cast<std::size_t>(r) * kHead], &sent[static_cast<std::size_t>(r) * 2 * kHead + kHead],
                               kHead) == 0;
    }
    f.check(ok, "relayout: the narrow blocks hold the heads sent, row by row");
  }
  barrier([&] { pump(); });
  f.check(t.relayout(last, kWide, kBlocks).ok(), "relayout: back to 16 blocks of two heads a row");
  barrier([&] { pump(); });
  if (me == 0) {
    mpi::XferId x = 0;
    const int32_t one[] = {4}, at[] = {15};
    f.check(t.post(last, one, at, note("whole"), x).ok(), "relayout: post whole blocks again");
    wait(x, "relayout: whole blocks");
  }
  if (me == last) {
    arrive(1);
    f.check(holds(a, pool, kWide, 15, 0, 4, 9), "relayout: a whole block lands in the first layout again");
  }
  barrier([&] { pump(); });
  f.check(t.destroy().ok(), "relayout: destroy");
  return f;
}

}  // namespace tandem::conformance
