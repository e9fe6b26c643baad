#include "mpi_transport/mpi_tp_group.h"

#include <algorithm>
#include <climits>

#include "common/error.h"
#include "mpi_transport/mpi_check.h"
#include "runtime/cpu/row_parallel.h"

namespace tandem::mpi {

MpiTpGroup::MpiTpGroup(MPI_Comm group) : comm_(group), buffers_(4) {
  TANDEM_MPI_OR_THROW(MPI_Comm_rank(comm_, &rank_));
  TANDEM_MPI_OR_THROW(MPI_Comm_size(comm_, &width_));
}

void MpiTpGroup::reduce_tree(float* data, int64_t n) {
  if (width_ == 1) return;
  if (n > INT_MAX) throw Error("a tensor-parallel exchange of " + std::to_string(n) + " floats is too large for MPI");
  gathered_.resize(static_cast<std::size_t>(n * width_));
  TANDEM_MPI_OR_THROW(MPI_Allgather(data, static_cast<int>(n), MPI_FLOAT, gathered_.data(), static_cast<int>(n),
                                    MPI_FLOAT, comm_));
  std::vector<const float*> parts;
  for (int r = 0; r < width_; ++r) parts.push_back(gathered_.data() + static_cast<std::ptrdiff_t>(r) * n);
  runtime::cpu::sum_in_tree(parts, n, data, buffers_);
}

}  // namespace tandem::mpi
