// A tensor-parallel group of threads for tests: one thread per rank, the
// group's collectives through buffers every rank sees (in place of MPI).
#pragma once

#include <barrier>
#include <cstring>
#include <vector>

#include "runtime/cpu/row_parallel.h"
#include "runtime/cpu/tp_group.h"

namespace tandem::testing {

// One thread per rank; the exchange through buffers every rank sees.
class ThreadGroup {
 public:
  explicit ThreadGroup(int width) : width_(width), slots_(static_cast<std::size_t>(width)), sync_(width) {}

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

   private:
    ThreadGroup& g_;
    int rank_;
  };

 private:
  int width_;
  std::vector<std::vector<float>> slots_;
  std::barrier<> sync_;
};

}  // namespace tandem::testing
