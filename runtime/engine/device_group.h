// A tensor-parallel group as a device backend sees it (the CUDA model's,
// runtime/cuda/cuda_model.h): the ranks' partial sums of a row-parallel
// product gathered in device memory, enqueued on the model's stream, so that
// a step stays one stream of work (and a captured graph where the group
// allows). The sum itself is the model's, in rank order in a fixed tree
// (runtime/cpu/row_parallel.h's), not a collective reduction whose order of
// addition is the library's. Over NCCL between ranks
// (mpi_transport/nccl/nccl_tp_group.h); over device buffers between threads
// in the GPU tests. Nothing here names CUDA: streams are opaque.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "runtime/cpu/tp_group.h"

namespace tandem::runtime {

class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;
  virtual cpu::TpShard shard() const = 0;
  // Enqueues on `stream` (a cudaStream_t): all[r * n, (r + 1) * n) = rank r's
  // `mine` (n floats), for every rank r of the group, in device memory.
  virtual void all_gather(const float* mine, float* all, int64_t n, void* stream) = 0;
  // Enqueues on `stream`: this rank sends send[q * n, (q + 1) * n) to rank q
  // and receives rank q's block for it into recv[q * n, (q + 1) * n), for
  // every rank q (itself too), in device memory. Expert parallelism's combine.
  virtual void all_to_all(const float* send, float* recv, int64_t n, void* stream) = 0;
  // Whether the group's exchanges may be captured in a CUDA graph (NCCL's may: every rank captures the same steps).
  virtual bool graph_safe() const { return true; }

  // Called while the model waits for a step that holds the group's exchanges:
  // the rank moves its KV on meanwhile, as the CPU group's waits do
  // (mpi_transport/mpi_tp_group.h), so no rank waiting on it waits for ever.
  void set_progress(std::function<void()> progress) { progress_ = std::move(progress); }
  void progress() {
    if (progress_) progress_();
  }

 private:
  std::function<void()> progress_;
};

}  // namespace tandem::runtime
