// The KvTransport conformance suite: every backend must pass it. It runs on
// every rank of a job of at least 3 ranks (threads for loopback, processes
// for MPI); `barrier` synchronises them. Failures are collected as text, so
// the harness decides how to report them (Catch2, or a plain main()).
#pragma once

#include <cstring>
#include <functional>
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
// device pool's test passes cudaMemcpy wrappers.
struct PoolAccess {
  std::function<void(uint8_t* dst, const void* src, std::size_t n)> write = [](uint8_t* d, const void* s, std::size_t n) {
    std::memcpy(d, s, n);
  };
  std::function<void(void* dst, const uint8_t* src, std::size_t n)> read = [](void* d, const uint8_t* s, std::size_t n) {
    std::memcpy(d, s, n);
  };
};

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

inline void wait(mpi::KvTransport& t, mpi::Transfer& x, Failures& f, const std::string& what) {
  for (int i = 0; i < 10000000 && !x.done; ++i) {
    if (!t.test(x).ok()) {
      f.check(false, what + ": test() failed");
      return;
    }
  }
  f.check(x.done, what + ": transfer never completed");
}

// Runs every case. The last rank receives ("decode"); ranks 0 and 1 send
// ("prefill"); with two ranks only, rank 0 is both senders, one after the other.
inline Failures run_transport_suite(mpi::KvTransport& t, const std::function<void()>& barrier,
                                    const PoolAccess& access = {}) {
  Failures f;
  const int me = t.rank();
  const std::size_t bb = 4096 + 256;  // not a power of two, as real blocks are not
  const int64_t n = 64;
  void* base = nullptr;
  f.check(t.create_pool(bb, n, &base).ok(), "create_pool");
  auto* pool = static_cast<uint8_t*>(base);
  const int decode = t.size() - 1, second = t.size() > 2 ? 1 : 0;

  // 1. One block from rank 0 to rank 2.
  if (me == 0) fill(access, pool, bb, 5, 0, 1);
  barrier();
  if (me == 0) {
    mpi::Transfer x;
    const int32_t src[] = {5}, dst[] = {9};
    f.check(t.post(decode, src, dst, x).ok(), "one block: post");
    wait(t, x, f, "one block");
    f.check(x.bytes == bb, "one block: bytes reported");
  }
  barrier();
  if (me == decode) f.check(holds(access, pool, bb, 9, 0, 5, 1), "one block: data at the target");

  // 2. Two senders at once into disjoint blocks; runs of consecutive ids and scattered ones.
  const std::vector<int32_t> src0 = {0, 1, 2, 3, 10, 12, 13}, dst0 = {20, 21, 22, 23, 40, 2, 3};
  const std::vector<int32_t> src1 = {7, 8, 9, 30, 31}, dst1 = {50, 51, 52, 60, 61};
  // (With two ranks, rank 0 sends both lists: src1's pattern then names rank 1 all the same.)
  if (me == 0)
    for (auto b : src0) fill(access, pool, bb, b, 0, 2);
  if (me == second)
    for (auto b : src1) fill(access, pool, bb, b, 1, 2);
  barrier();
  if (me == 0 || me == second) {
    mpi::Transfer x, y;
    if (me == 0) f.check(t.post(decode, src0, dst0, x).ok(), "two senders: post");
    if (me == second) f.check(t.post(decode, src1, dst1, y).ok(), "two senders: post");
    if (me == 0) wait(t, x, f, "two senders");
    if (me == second) wait(t, y, f, "two senders");
  }
  barrier();
  if (me == decode) {
    for (std::size_t i = 0; i < src0.size(); ++i)
      f.check(holds(access, pool, bb, dst0[i], 0, src0[i], 2),
              "two senders: block from rank 0 -> " + std::to_string(dst0[i]));
    for (std::size_t i = 0; i < src1.size(); ++i)
      f.check(holds(access, pool, bb, dst1[i], 1, src1[i], 2),
              "two senders: block from rank 1 -> " + std::to_string(dst1[i]));
  }

  // 3. The whole pool in one transfer (one run), twice, the second overwriting the first.
  for (int round = 3; round <= 4; ++round) {
    std::vector<int32_t> all(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
    if (me == second)
      for (auto b : all) fill(access, pool, bb, b, 1, round);
    barrier();
    if (me == second) {
      mpi::Transfer x;
      f.check(t.post(decode, all, all, x).ok(), "whole pool: post");
      wait(t, x, f, "whole pool");
      f.check(x.bytes == bb * static_cast<std::size_t>(n), "whole pool: bytes reported");
    }
    barrier();
    if (me == decode) {
      bool all_ok = true;
      for (auto b : all) all_ok = all_ok && holds(access, pool, bb, b, 1, b, round);
      f.check(all_ok, "whole pool round " + std::to_string(round) + ": data at the target");
    }
  }

  // 4. An empty transfer completes; bad arguments are errors, not crashes.
  if (me == 0) {
    mpi::Transfer x;
    f.check(t.post(decode, {}, {}, x).ok(), "empty: post");
    wait(t, x, f, "empty");
    const int32_t ok[] = {1}, bad[] = {static_cast<int32_t>(n)};
    f.check(!t.post(decode, ok, bad, x).ok(), "dst block outside the peer's pool is refused");
    f.check(!t.post(decode, bad, ok, x).ok(), "src block outside our pool is refused");
    f.check(!t.post(99, ok, ok, x).ok(), "unknown peer is refused");
    const int32_t two[] = {1, 2};
    f.check(!t.post(decode, two, ok, x).ok(), "lists of different lengths are refused");
  }
  barrier();
  f.check(t.destroy().ok(), "destroy");
  return f;
}

}  // namespace tandem::conformance
