#include "mpi_transport/nccl/nccl_tp_group.h"

#include <cuda_runtime_api.h>

#include <exception>
#include <string>

#include "common/error.h"
#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {
namespace {

void nccl_or_throw(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw Error(std::string("the tensor-parallel group's NCCL ") + what + ": " + ncclGetErrorString(r) +
                " (NCCL_DEBUG=WARN says more; each rank of a group needs a GPU of its own)");
}

}  // namespace

NcclTpGroup::NcclTpGroup(MPI_Comm group) {
  TANDEM_MPI_OR_THROW(MPI_Comm_rank(group, &rank_));
  TANDEM_MPI_OR_THROW(MPI_Comm_size(group, &width_));
  ncclUniqueId id{};
  if (rank_ == 0) nccl_or_throw(ncclGetUniqueId(&id), "id");
  TANDEM_MPI_OR_THROW(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, group));
  nccl_or_throw(ncclCommInitRank(&comm_, width_, id, rank_), "setup (ncclCommInitRank)");
}

NcclTpGroup::~NcclTpGroup() {
  if (!comm_) return;
  // While an exception unwinds another rank may never take part again: abort rather than wait for it.
  if (std::uncaught_exceptions() > 0) ncclCommAbort(comm_);
  else ncclCommDestroy(comm_);
}

void NcclTpGroup::all_gather(const float* mine, float* all, int64_t n, void* stream) {
  nccl_or_throw(ncclAllGather(mine, all, static_cast<std::size_t>(n), ncclFloat, comm_, static_cast<cudaStream_t>(stream)),
                "exchange (ncclAllGather)");
}

}  // namespace tandem::mpi
