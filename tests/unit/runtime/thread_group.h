// A tensor-parallel group of threads for tests: one thread per rank, the
// group's collectives through buffers every rank sees (in place of MPI).
#pragma once

#include <algorithm>
#include <barrier>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "runtime/cpu/row_parallel.h"
#include "runtime/cpu/tp_group.h"

namespace tandem::testing {

// One thread per rank; the exchange through buffers every rank sees.
class ThreadGroup {
 public:
  explicit ThreadGroup(int width)
      : width_(width), slots_(static_cast<std::size_t>(width)), counts_(static_cast<std::size_t>(width)), sync_(width) {}

  class Member : public runtime::cpu::TpGroup {
   public:
    Member(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
    runtime::cpu::TpShard shard() const override { return {rank_, g_.width_}; }
    void reduce_tree(float* data, int64_t n) override {
      g_.slots_[static_cast<std::size_t>(rank_)].assign(data, data + n);
      g_.sync_.arrive_and_wait();
      std::vector<const float*> parts;
      for (const auto& s : g_.slots_) parts.push_back(s.data());
      std::vector<std::vector<float>> buffers(4);
      runtime::cpu::sum_in_tree(parts, n, data, buffers);
      g_.sync_.arrive_and_wait();  // nobody writes a slot again before every rank has read them all
    }
    void gather(const void* mine, std::size_t bytes, void* all) override {
      const auto* p = static_cast<const float*>(mine);
      g_.slots_[static_cast<std::size_t>(rank_)].assign(p, p + bytes / sizeof(float));
      g_.sync_.arrive_and_wait();
      if (rank_ == 0)
        for (int r = 0; r < g_.width_; ++r)
          std::memcpy(static_cast<char*>(all) + r * bytes, g_.slots_[static_cast<std::size_t>(r)].data(), bytes);
      g_.sync_.arrive_and_wait();
    }
    void scatter(const void* all, std::size_t bytes, void* mine) override {
      if (rank_ == 0)
        for (int r = 0; r < g_.width_; ++r) {
          const auto* p = static_cast<const float*>(all) + r * (bytes / sizeof(float));
          g_.slots_[static_cast<std::size_t>(r)].assign(p, p + bytes / sizeof(float));
        }
      g_.sync_.arrive_and_wait();
      std::memcpy(mine, g_.slots_[static_cast<std::size_t>(rank_)].data(), bytes);
      g_.sync_.arrive_and_wait();
    }

    // Every rank's send buffer in its slot, then each takes its parts.
    void all_to_all(const float* send, std::span<const int64_t> send_counts, float* recv,
                    std::span<const int64_t> recv_counts) override {
      int64_t total = 0;
      for (const int64_t c : send_counts) total += c;
      g_.slots_[static_cast<std::size_t>(rank_)].assign(send, send + total);
      g_.counts_[static_cast<std::size_t>(rank_)].assign(send_counts.begin(), send_counts.end());
      g_.sync_.arrive_and_wait();
      for (int q = 0; q < g_.width_; ++q) {
        const auto& theirs = g_.counts_[static_cast<std::size_t>(q)];
        int64_t at = 0;
        for (int d = 0; d < rank_; ++d) at += theirs[static_cast<std::size_t>(d)];
        const int64_t n = theirs[static_cast<std::size_t>(rank_)];
        if (n != recv_counts[static_cast<std::size_t>(q)]) throw std::logic_error("all_to_all: the counts disagree");
        std::copy_n(g_.slots_[static_cast<std::size_t>(q)].data() + at, n, recv);
        recv += n;
      }
      g_.sync_.arrive_and_wait();
    }
    void all_gather(const float* mine, std::span<const int64_t> counts, float* all) override {
      g_.slots_[static_cast<std::size_t>(rank_)].assign(mine, mine + counts[static_cast<std::size_t>(rank_)]);
      g_.sync_.arrive_and_wait();
      for (int q = 0; q < g_.width_; ++q) {
        const auto& s = g_.slots_[static_cast<std::size_t>(q)];
        if (static_cast<int64_t>(s.size()) != counts[static_cast<std::size_t>(q)])
          throw std::logic_error("all_gather: the counts disagree");
        all = std::copy(s.begin(), s.end(), all);
      }
      g_.sync_.arrive_and_wait();
    }

   private:
    ThreadGroup& g_;
    int rank_;
  };

 private:
  int width_;
  std::vector<std::vector<float>> slots_;
  std::vector<std::vector<int64_t>> counts_;  // all_to_all: each rank's send counts
  std::barrier<> sync_;
};

}  // namespace tandem::testing
