// A tensor-parallel group's device exchange over NCCL (runtime/engine/
// device_group.h): one NCCL communicator over the group's MPI communicator
// (rank 0's ncclUniqueId broadcast with MPI), and ncclAllGather of the
// ranks' partial sums on the model's stream, which CUDA graphs capture (and
// ncclSend/ncclRecv to every rank for a mixture of experts' combine). The
// sum is the model's own, in rank order (runtime/cuda/cuda_model.h). Every
// rank of a group must be on a GPU of its own (NCCL refuses two ranks on one
// device). Built with TANDEM_NCCL only; make it through
// transport_registry.h's make_device_group.
#pragma once

#include <mpi.h>
#include <nccl.h>

#include "runtime/engine/device_group.h"

namespace tandem::mpi {

class NcclTpGroup : public runtime::DeviceGroup {
 public:
  // Collective over `group` (the communicator stays the caller's), on the
  // current device; ends with one exchange, so the ranks are connected
  // before any step. Throws tandem::Error when NCCL cannot set up.
  explicit NcclTpGroup(MPI_Comm group);
  ~NcclTpGroup() override;
  NcclTpGroup(const NcclTpGroup&) = delete;
  NcclTpGroup& operator=(const NcclTpGroup&) = delete;

  runtime::cpu::TpShard shard() const override { return {rank_, width_}; }
  // Throws tandem::Error on an NCCL error.
  void all_gather(const float* mine, float* all, int64_t n, void* stream) override;
  // ncclSend/ncclRecv to and from every rank in one NCCL group call.
  void all_to_all(const float* send, float* recv, int64_t n, void* stream) override;
  // Captured in CUDA graphs: NCCL asks that a launch be captured on every rank of it or on none (its CUDA graphs
  // guide: "uniform over all ranks"), and every rank's model captures the same decode steps
  // (CudaModel::forward_follower lays a follower's steps out as its leader's).

 private:
  ncclResult_t all_to_all_result(const float* send, float* recv, int64_t n, void* stream);
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, width_ = 1;
};

}  // namespace tandem::mpi
