// The KvTransport conformance suite: every backend must pass it. It runs on
// every rank of a job of at least 3 ranks (threads for loopback, processes
// for MPI); `barrier` synchronises them, calling `pump` while it waits (a
// two-sided target places incoming blocks only when it makes progress).
// Failures are collected as text, so the harness decides how to report them
// (Catch2, or a plain main()).
//
// What it holds every backend to: data lands where asked, runs coalesced or
// scattered; the notification arrives exactly once per post, only once the
// data is in place (checked the moment it arrives); an empty transfer still notifies; many transfers in flight at
// once; abort delivers one notification marked aborted and frees the
// sender; bad arguments are errors, not crashes; the pool either allocated
// by the backend or registered from the caller's memory.
#pragma once

#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "mpi_transport/kv_transport.h"

namespace tandem::conformance {

struct Failures {
  std::vector<std::string> list;
  int checks = 0;
  void check(bool ok, const std::string& what) {
    ++checks;
    if (!ok) list.push_back(what);
  }
};

// How the suite reaches a pool's memory: plain memcpy for host pools; a
// device pool's test passes cudaMemcpy wrappers (and its allocator, for the
// caller-memory run).
struct PoolAccess {
  std::function<void(uint8_t* dst, const void* src, std::size_t n)> write = [](uint8_t* d, const void* s, std::size_t n) {
    std::memcpy(d, s, n);
  };
  std::function<void(void* dst, const uint8_t* src, std::size_t n)> read = [](void* d, const uint8_t* s, std::size_t n) {
    std::memcpy(d, s, n);
  };
  std::function<std::shared_ptr<void>(std::size_t)> allocate = [](std::size_t n) {
    return std::shared_ptr<void>(new uint8_t[n](), [](void* p) { delete[] static_cast<uint8_t*>(p); });
  };
};

using Barrier = std::function<void(const std::function<void()>& pump)>;

// The pattern of block `block` of `rank` in `round`.
inline std::vector<uint8_t> pattern(std::size_t block_bytes, int32_t block, int rank, int round) {
  std::vector<uint8_t> out(block_bytes);
  auto* p = reinterpret_cast<uint32_t*>(out.data());
  for (std::size_t i = 0; i < block_bytes / 4; ++i)
    p[i] = static_cast<uint32_t>(rank) * 0x01000193u ^ static_cast<uint32_t>(block) * 0x9E3779B1u ^
           static_cast<uint32_t>(round) * 0x85EBCA6Bu ^ static_cast<uint32_t>(i);
  return out;
}

// Fills block b of `rank`'s pool with a pattern naming (rank, block, round).
inline void fill(const PoolAccess& a, uint8_t* pool, std::size_t block_bytes, int32_t block, int rank, int round) {
  const auto p = pattern(block_bytes, block, rank, round);
  a.write(pool + static_cast<std::size_t>(block) * block_bytes, p.data(), block_bytes);
}

inline bool holds(const PoolAccess& a, const uint8_t* pool, std::size_t block_bytes, int32_t block, int rank,
                  int32_t src_block, int round) {
  std::vector<uint8_t> got(block_bytes);
  a.read(got.data(), pool + static_cast<std::size_t>(block) * block_bytes, block_bytes);
  return got == pattern(block_bytes, src_block, rank, round);
}

inline std::vector<uint8_t> note(const std::string& s) { return {s.begin(), s.end()}; }

// A suite's hold on its transport: progress (notifications into inbox), and
// waiting out a transfer of its own (then released).
struct Driver {
  mpi::KvTransport& t;
  Failures& f;
  std::string suite;  // names the suite in failures
  std::vector<mpi::Notification> inbox;
  void pump() {
    if (!t.progress(inbox).ok()) f.check(false, suite + ": progress() failed");
  }
  void wait(mpi::XferId id, const std::string& what) {
    mpi::XferState st = mpi::XferState::kPending;
    for (long i = 0; i < 20000000 && st == mpi::XferState::kPending; ++i) {
      if (!t.poll(id, st).ok()) break;
      pump();
    }
    f.check(st == mpi::XferState::kDone, what + ": done");
    t.release(id);
  }
};

struct RowSliceCase {
  std::vector<int32_t> src, dst;
  mpi::RowSlice slice;
};
inline std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// One rank's side of the suite: its transport, its inbox, its checks.
class Suite {
 public:
  Suite(mpi::KvTransport& t, Barrier barrier, const PoolAccess& access) : t_(t), barrier_(std::move(barrier)), a_(access) {}

  // Collects arrived notifications; a check runs on each the moment it
  // arrives. During a barrier a faster rank may already have posted the
  // next case's transfer: what arrives then is kept for that case.
  void pump() {
    std::vector<mpi::Notification> got;
    if (!t_.progress(got).ok()) f_.check(false, "progress() failed");
    if (in_barrier_) {
      for (auto& n : got) early_.push_back(std::move(n));
      return;
    }
    got.insert(got.begin(), std::make_move_iterator(early_.begin()), std::make_move_iterator(early_.end()));
    early_.clear();
    for (auto& n : got) {
      if (on_arrival_) on_arrival_(n);
      inbox_.push_back(std::move(n));
    }
  }
  void barrier() {
    in_barrier_ = true;
    barrier_([this] { pump(); });
    in_barrier_ = false;
  }
  // Polls until the transfer is done (or aborted); returns the final state.
  mpi::XferState wait(mpi::XferId id, const std::string& what) {
    mpi::XferState st = mpi::XferState::kPending;
    for (long i = 0; i < 20000000 && st == mpi::XferState::kPending; ++i) {
      if (!t_.poll(id, st).ok()) {
        f_.check(false, what + ": poll() failed");
        return st;
      }
      pump();
    }
    f_.check(st != mpi::XferState::kPending, what + ": transfer never completed");
    return st;
  }
  // Pumps until `n` notifications are in the inbox (or gives up).
  void expect_notifications(std::size_t n, const std::string& what) {
    for (long i = 0; i < 20000000 && inbox_.size() < n; ++i) pump();
    f_.check(inbox_.size() == n, what + ": " + std::to_string(inbox_.size()) + " notification(s), expected " +
                                     std::to_string(n));
  }

  Failures run(bool caller_memory) {
    const int me = t_.rank();
    const std::size_t bb = 4096 + 256;  // not a power of two, as real blocks are not
    const int64_t n = 64;
    const std::string how = caller_memory ? " [caller memory]" : "";
    void* base = nullptr;
    std::shared_ptr<void> owned;
    if (caller_memory) {
      owned = a_.allocate(bb * static_cast<std::size_t>(n));
      base = owned.get();
      f_.check(t_.register_pool(base, bb, n).ok(), "register_pool");
    } else {
      f_.check(t_.allocate_pool(bb, n, &base).ok(), "allocate_pool");
    }
    pool_ = static_cast<uint8_t*>(base);
    decode_ = t_.size() - 1;
    const int second = t_.size() > 2 ? 1 : 0;

    // 1. One block from rank 0 to the last rank; the notification arrives with the data in place.
    if (me == 0) fill(a_, pool_, bb, 5, 0, 1);
    barrier();
    if (me == decode_) on_arrival_ = [&](const mpi::Notification& x) {
      f_.check(x.peer == 0 && !x.aborted && text(x.bytes) == "first token 42", "one block: notification" + how);
      f_.check(holds(a_, pool_, bb, 9, 0, 5, 1), "one block: data in place when the notification arrives" + how);
    };
    if (me == 0) {
      mpi::XferId id = 0;
      const int32_t src[] = {5}, dst[] = {9};
      f_.check(t_.post(decode_, src, dst, note("first token 42"), id).ok(), "one block: post");
      f_.check(wait(id, "one block") == mpi::XferState::kDone, "one block: done" + how);
      t_.release(id);
    }
    if (me == decode_) expect_notifications(1, "one block");
    barrier();
    take();

    // 2. Two senders at once into disjoint blocks; runs of consecutive ids and scattered ones.
    const std::vector<int32_t> src0 = {0, 1, 2, 3, 10, 12, 13}, dst0 = {20, 21, 22, 23, 40, 2, 3};
    const std::vector<int32_t> src1 = {7, 8, 9, 30, 31}, dst1 = {50, 51, 52, 60, 61};
    // (With two ranks, rank 0 sends both lists: src1's pattern then names rank 1 all the same.)
    if (me == 0)
      for (auto b : src0) fill(a_, pool_, bb, b, 0, 2);
    if (me == second)
      for (auto b : src1) fill(a_, pool_, bb, b, 1, 2);
    barrier();
    if (me == decode_) on_arrival_ = [&](const mpi::Notification& x) {
      const bool from0 = text(x.bytes) == "from 0";
      const auto& s = from0 ? src0 : src1;
      const auto& d = from0 ? dst0 : dst1;
      bool ok = true;
      for (std::size_t i = 0; i < s.size(); ++i) ok = ok && holds(a_, pool_, bb, d[i], from0 ? 0 : 1, s[i], 2);
      f_.check(ok, std::string("two senders: ") + (from0 ? "rank 0's" : "rank 1's") + " blocks in place at its notification" + how);
    };
    if (me == 0 || me == second) {
      mpi::XferId x = 0, y = 0;
      if (me == 0) f_.check(t_.post(decode_, src0, dst0, note("from 0"), x).ok(), "two senders: post");
      if (me == second) f_.check(t_.post(decode_, src1, dst1, note("from 1"), y).ok(), "two senders: post");
      if (me == 0) {
        wait(x, "two senders");
        t_.release(x);
      }
      if (me == second) {
        wait(y, "two senders");
        t_.release(y);
      }
    }
    if (me == decode_) expect_notifications(2, "two senders");
    barrier();
    take();

    // 3. The whole pool in one transfer (one run), twice, the second overwriting the first.
    for (int round = 3; round <= 4; ++round) {
      std::vector<int32_t> all(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
      if (me == second)
        for (auto b : all) fill(a_, pool_, bb, b, 1, round);
      barrier();
      if (me == decode_) on_arrival_ = [&, round, all](const mpi::Notification&) {
        bool ok = true;
        for (auto b : all) ok = ok && holds(a_, pool_, bb, b, 1, b, round);
        f_.check(ok, "whole pool round " + std::to_string(round) + ": data in place at the notification" + how);
      };
      if (me == second) {
        mpi::XferId x = 0;
        f_.check(t_.post(decode_, all, all, {}, x).ok(), "whole pool: post");
        wait(x, "whole pool");
        t_.release(x);
      }
      if (me == decode_) expect_notifications(1, "whole pool");
      barrier();
      take();
    }

    // 4. Many transfers in flight at once: 24 posts before any poll; each
    // notification comes once (in any order), with its own data in place.
    std::vector<bool> seen(24, false);
    if (me == 0)
      for (int32_t b = 0; b < 24; ++b) fill(a_, pool_, bb, b, 0, 5);
    barrier();
    if (me == decode_) on_arrival_ = [&](const mpi::Notification& x) {
      const std::string t = text(x.bytes);
      const int k = !t.empty() && t.find_first_not_of("0123456789") == std::string::npos ? std::stoi(t) : -1;
      if (k < 0) f_.check(false, "in flight: a notification that is not one of these: '" + t + "'" + (x.aborted ? " (aborted)" : ""));
      f_.check(k >= 0 && k < 24 && !seen[static_cast<std::size_t>(k)], "in flight: notification " + std::to_string(k) + " once" + how);
      if (k >= 0 && k < 24) seen[static_cast<std::size_t>(k)] = true;
      f_.check(holds(a_, pool_, bb, 63 - k, 0, k, 5), "in flight: transfer " + std::to_string(k) + "'s block in place" + how);
    };
    if (me == 0) {
      std::vector<mpi::XferId> ids(24);
      for (int32_t k = 0; k < 24; ++k) {
        const int32_t src[] = {k}, dst[] = {63 - k};
        f_.check(t_.post(decode_, src, dst, note(std::to_string(k)), ids[static_cast<std::size_t>(k)]).ok(),
                 "in flight: post " + std::to_string(k));
      }
      for (auto id : ids) {
        wait(id, "in flight");
        t_.release(id);
      }
    }
    if (me == decode_) expect_notifications(24, "in flight");
    barrier();
    take();

    // 5. An empty transfer still notifies (a prompt the decode rank had all cached: only the first token travels).
    if (me == decode_) on_arrival_ = [&](const mpi::Notification& x) {
      f_.check(text(x.bytes) == "nothing to move" && !x.aborted, "empty: notification" + how);
    };
    if (me == 0) {
      mpi::XferId x = 0;
      f_.check(t_.post(decode_, {}, {}, note("nothing to move"), x).ok(), "empty: post");
      f_.check(wait(x, "empty") == mpi::XferState::kDone, "empty: done");
      t_.release(x);
    }
    if (me == decode_) expect_notifications(1, "empty");
    barrier();
    take();

    // 6. Abort: the sender is released (kAborted) and the peer hears exactly once, marked aborted.
    if (me == 0)
      for (int32_t b = 0; b < 8; ++b) fill(a_, pool_, bb, b, 0, 6);
    barrier();
    if (me == decode_) on_arrival_ = [&](const mpi::Notification& x) {
      f_.check(x.aborted && x.peer == 0, "abort: the notification says aborted" + how);
    };
    if (me == 0) {
      mpi::XferId x = 0;
      const std::vector<int32_t> src = {0, 1, 2, 3, 4, 5, 6, 7}, dst = {30, 31, 32, 33, 34, 35, 36, 37};
      f_.check(t_.post(decode_, src, dst, note("should not be seen"), x).ok(), "abort: post");
      f_.check(t_.abort(x).ok(), "abort: abort()");
      f_.check(wait(x, "abort") == mpi::XferState::kAborted, "abort: poll reports aborted" + how);
      t_.release(x);
    }
    if (me == decode_) {
      expect_notifications(1, "abort");
      for (int i = 0; i < 2000; ++i) pump();  // and no second one
      f_.check(inbox_.size() == 1, "abort: exactly one notification");
    }
    barrier();
    take();

    // 7. Bad arguments are errors, not crashes.
    if (me == 0) {
      mpi::XferId x = 0;
      const int32_t ok[] = {1}, bad[] = {static_cast<int32_t>(n)};
      f_.check(!t_.post(decode_, ok, bad, {}, x).ok(), "dst block outside the peer's pool is refused");
      f_.check(!t_.post(decode_, bad, ok, {}, x).ok(), "src block outside our pool is refused");
      f_.check(!t_.post(99, ok, ok, {}, x).ok(), "unknown peer is refused");
      const int32_t two[] = {1, 2};
      f_.check(!t_.post(decode_, two, ok, {}, x).ok(), "lists of different lengths are refused");
      const std::vector<uint8_t> huge(t_.capabilities().max_notification_bytes + 1, 7);
      f_.check(!t_.post(decode_, ok, ok, huge, x).ok(), "a notification over max_notification_bytes is refused");
      mpi::XferState st;
      f_.check(!t_.poll(123456789, st).ok(), "polling an unknown transfer is an error");
    }
    barrier();
    if (me == decode_) {
      for (int i = 0; i < 2000; ++i) pump();
      f_.check(inbox_.empty(), "refused posts notify nobody");
    }
    f_.check(t_.destroy().ok(), "destroy");
    return f_;
  }

 private:
  void take() {
    inbox_.clear();
    on_arrival_ = nullptr;
  }

  mpi::KvTransport& t_;
  Barrier barrier_;
  const PoolAccess& a_;
  Failures f_;
  uint8_t* pool_ = nullptr;
  int decode_ = 0;
  std::vector<mpi::Notification> inbox_, early_;
  bool in_barrier_ = false;
  std::function<void(const mpi::Notification&)> on_arrival_;
};

// KV between tensor-parallel groups of different widths: pools whose blocks
// differ in size (each rank holds other KV heads), moved as row slices
// (post_slice). Rank 0 holds 4 heads a row, rank 1 two, the last rank three;
// the last rank's rows get heads 1-2 of rank 0's and head 0 of rank 1's.
// Needs 3 ranks; a backend without capabilities().row_slices must refuse.
inline Failures run_slice_suite(mpi::KvTransport& t, const Barrier& barrier, const PoolAccess& a = {}) {
  Failures f;
  const int me = t.rank(), last = t.size() - 1;
  constexpr int64_t kRows = 5, kBlocks = 16;
  constexpr std::size_t kHead = 12;  // bytes of one head in a row: not a power of two
  const std::size_t heads = me == 0 ? 4 : me == last ? 3 : 2;
  const std::size_t bb = kRows * heads * kHead;
  void* base = nullptr;
  f.check(t.allocate_pool(bb, kBlocks, &base).ok(), "slices: allocate_pool of " + std::to_string(bb) + "-byte blocks");
  auto* pool = static_cast<uint8_t*>(base);
  Driver drive{t, f, "slices", {}};
  std::vector<mpi::Notification>& inbox = drive.inbox;
  auto pump = [&] { drive.pump(); };
  auto wait = [&](mpi::XferId id, const std::string& what) { drive.wait(id, what); };
  for (int32_t b = 0; b < kBlocks; ++b) fill(a, pool, bb, b, me, 7);
  const RowSliceCase from0{{2, 3, 4, 9}, {0, 1, 2, 7}, {kRows, 1 * kHead, 0, 2 * kHead}};
  const RowSliceCase from1{{5, 6, 7, 12}, {0, 1, 2, 7}, {kRows, 0, 2 * kHead, 1 * kHead}};
  barrier([&] { pump(); });
  if (!t.capabilities().row_slices) {
    mpi::XferId x = 0;
    if (me == 0) f.check(!t.post_slice(last, from0.src, from0.dst, from0.slice, {}, x).ok(), "slices: refused without row_slices");
    barrier([&] { pump(); });
    f.check(t.destroy().ok(), "slices: destroy");
    return f;
  }
  if (me == 0 || me == 1) {
    const RowSliceCase& c = me == 0 ? from0 : from1;
    mpi::XferId x = 0;
    f.check(t.post_slice(last, c.src, c.dst, c.slice, note("slice from " + std::to_string(me)), x).ok(), "slices: post");
    wait(x, "slices");
  }
  if (me == last) {
    for (long i = 0; i < 20000000 && inbox.size() < 2; ++i) pump();
    f.check(inbox.size() == 2, "slices: two notifications, got " + std::to_string(inbox.size()));
    // Row by row: heads 1-2 of rank 0's row, then head 0 of rank 1's; block 3 (no one's target) untouched.
    bool ok = true;
    std::vector<uint8_t> got(bb);
    for (std::size_t i = 0; i < from0.dst.size(); ++i) {
      a.read(got.data(), pool + static_cast<std::size_t>(from0.dst[i]) * bb, bb);
      const auto p0 = pattern(kRows * 4 * kHead, from0.src[i], 0, 7), p1 = pattern(kRows * 2 * kHead, from1.src[i], 1, 7);
      for (int64_t r = 0; r < kRows; ++r) {
        const auto row = static_cast<std::size_t>(r);
        ok = ok && std::memcmp(&got[row * 3 * kHead], &p0[row * 4 * kHead + kHead], 2 * kHead) == 0 &&
             std::memcmp(&got[row * 3 * kHead + 2 * kHead], &p1[row * 2 * kHead], kHead) == 0;
      }
    }
    f.check(ok, "slices: each row holds its heads from both senders");
    f.check(holds(a, pool, bb, 3, last, 3, 7), "slices: a block no one sent to is untouched");
    inbox.clear();
  }
  barrier([&] { pump(); });
  // Many sliced transfers in flight at once, then bad slices refused.
  if (me == 0) {
    std::vector<mpi::XferId> ids(10);
    for (int32_t k = 0; k < 10; ++k) {
      const int32_t src[] = {k}, dst[] = {static_cast<int32_t>(15 - k)};
      f.check(t.post_slice(last, src, dst, {kRows, 0, kHead, 2 * kHead}, note(std::to_string(k)), ids[static_cast<std::size_t>(k)]).ok(),
              "slices in flight: post");
    }
    for (auto id : ids) wait(id, "slices in flight");
    mpi::XferId x = 0;
    const int32_t one[] = {1};
    f.check(!t.post_slice(last, one, one, {kRows, 40, 0, kHead}, {}, x).ok(), "slices: past the end of our row: refused");
    f.check(!t.post_slice(last, one, one, {kRows, 0, 30, kHead}, {}, x).ok(), "slices: past the end of the peer's row: refused");
    f.check(!t.post_slice(last, one, one, {7, 0, 0, kHead}, {}, x).ok(), "slices: rows that do not divide the blocks: refused");
    f.check(!t.post(last, one, one, {}, x).ok(), "slices: whole blocks of different sizes: refused");
  }
  if (me == last) {
    for (long i = 0; i < 20000000 && inbox.size() < 10; ++i) pump();
    bool ok = inbox.size() == 10;
    std::vector<uint8_t> got(bb);
    for (int32_t k = 0; k < 10 && ok; ++k) {
      a.read(got.data(), pool + static_cast<std::size_t>(15 - k) * bb, bb);
      const auto p0 = pattern(kRows * 4 * kHead, k, 0, 7);
      for (int64_t r = 0; r < kRows; ++r)
        ok = ok && std::memcmp(&got[static_cast<std::size_t>(r) * 3 * kHead + kHead], &p0[static_cast<std::size_t>(r) * 4 * kHead], 2 * kHead) == 0;
    }
    f.check(ok, "slices in flight: ten notifications, each transfer's rows in place");
  }
  barrier([&] { pump(); });
  if (me == last) {
    for (int i = 0; i < 2000; ++i) pump();
    f.check(inbox.size() == 10, "slices: refused posts notify nobody");
  }
  f.check(t.destroy().ok(), "slices: destroy");
  return f;
}

// Runs every case. The last rank receives ("decode"); ranks 0 and 1 send
// ("prefill"); with two ranks only, rank 0 is both senders, one after the other.
inline Failures run_transport_suite(mpi::KvTransport& t, const Barrier& barrier, const PoolAccess& access = {},
                                    bool caller_memory = false) {
  return Suite(t, barrier, access).run(caller_memory);
}

}  // namespace tandem::conformance
