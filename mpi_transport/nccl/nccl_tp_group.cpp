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
  // The first exchange's buffer (below), allocated and agreed on before any NCCL call: a rank whose allocation
  // failed and stopped would leave the others waiting in NCCL's setup or in the exchange for ever.
  float* scratch = nullptr;
  const cudaError_t made =
      cudaMalloc(reinterpret_cast<void**>(&scratch), sizeof(float) * static_cast<std::size_t>(3 * width_ + 1));
  const struct Freed {
    float* p;
    ~Freed() {
      if (p) cudaFree(p);
    }
  } freed{made == cudaSuccess ? scratch : nullptr};
  int ok = made == cudaSuccess, all_ok = 0;
  TANDEM_MPI_OR_THROW(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, group));
  if (!all_ok) {
    throw Error(ok ? std::string("another rank of this tensor-parallel group could not allocate GPU memory (its "
                                 "log line says why)")
                   : std::string("the tensor-parallel group's first exchange: cudaMalloc: ") + cudaGetErrorString(made));
  }
  // The id goes out with rank 0's verdict on it: a rank 0 that could not make one must not leave the others
  // waiting in the broadcast.
  struct {
    ncclUniqueId id;
    int result;
  } boot{};
  if (rank_ == 0) boot.result = static_cast<int>(ncclGetUniqueId(&boot.id));
  TANDEM_MPI_OR_THROW(MPI_Bcast(&boot, sizeof boot, MPI_BYTE, 0, group));
  nccl_or_throw(static_cast<ncclResult_t>(boot.result), "id (ncclGetUniqueId, on the group's first rank)");
  nccl_or_throw(ncclCommInitRank(&comm_, width_, boot.id, rank_), "setup (ncclCommInitRank)");
  // One exchange now, while the whole group is here: NCCL may connect its ranks on their first collective and
  // hold the host meanwhile, which inside a step would stop this rank's KV from moving.
  // Point-to-point connections are made on their first use too: one all-to-all as well.
  ncclResult_t r = ncclAllGather(scratch + width_, scratch, 1, ncclFloat, comm_, nullptr);
  if (r == ncclSuccess) r = all_to_all_result(scratch + width_, scratch + 2 * width_, 1, nullptr);
  const cudaError_t e = cudaStreamSynchronize(nullptr);
  nccl_or_throw(r, "first exchange (ncclAllGather, ncclSend/ncclRecv)");
  if (e != cudaSuccess)
    throw Error(std::string("the tensor-parallel group's first exchange: ") + cudaGetErrorString(e));
}

NcclTpGroup::~NcclTpGroup() {
  if (!comm_) return;
  // While an exception unwinds another rank may never take part again: abort rather than wait for it.
  if (std::uncaught_exceptions() > 0) ncclCommAbort(comm_);
  else ncclCommDestroy(comm_);
}

ncclResult_t NcclTpGroup::all_to_all_result(const float* send, float* recv, int64_t n, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  const auto count = static_cast<std::size_t>(n);
  ncclResult_t r = ncclGroupStart();
  for (int q = 0; q < width_ && r == ncclSuccess; ++q) {
    r = ncclSend(send + static_cast<std::size_t>(q) * count, count, ncclFloat, q, comm_, s);
    if (r == ncclSuccess) r = ncclRecv(recv + static_cast<std::size_t>(q) * count, count, ncclFloat, q, comm_, s);
  }
  const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after a failed call in it
  return r != ncclSuccess ? r : end;
}

void NcclTpGroup::all_to_all(const float* send, float* recv, int64_t n, void* stream) {
  nccl_or_throw(all_to_all_result(send, recv, n, stream), "exchange (ncclSend/ncclRecv)");
}

void NcclTpGroup::all_gather(const float* mine, float* all, int64_t n, void* stream) {
  nccl_or_throw(ncclAllGather(mine, all, static_cast<std::size_t>(n), ncclFloat, comm_, static_cast<cudaStream_t>(stream)),
                "exchange (ncclAllGather)");
}

}  // namespace tandem::mpi
