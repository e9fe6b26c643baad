// The control plane of the two-sided transports (MPI two-sided, NCCL): messages
// received as they come, and remote-completion acknowledgements (MPI
// two-sided, NCCL): the target sends a transfer's id back over MPI once the
// blocks have landed; the sender learns of it in poll(). Never blocks.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {

// Receives every message already waiting on (comm, tag), of MPI type `type`
// holding T elements, and calls on(source, elements) for each; never blocks.
template <class T, class F>
[[nodiscard]] Status receive_waiting(MPI_Comm comm, int tag, MPI_Datatype type, F&& on) {
  for (;;) {
    int flag = 0, count = 0;
    MPI_Status st;
    if (int rc = MPI_Iprobe(MPI_ANY_SOURCE, tag, comm, &flag, &st); rc != MPI_SUCCESS)
      return mpi_status(rc, "MPI_Iprobe", __FILE__, __LINE__);
    if (!flag) return Status();
    MPI_Get_count(&st, type, &count);
    std::vector<T> msg(static_cast<std::size_t>(count));
    if (int rc = MPI_Recv(msg.data(), count, type, st.MPI_SOURCE, tag, comm, MPI_STATUS_IGNORE); rc != MPI_SUCCESS)
      return mpi_status(rc, "MPI_Recv", __FILE__, __LINE__);
    TANDEM_RETURN_IF_ERROR(on(st.MPI_SOURCE, msg));
  }
}

class Acks {
 public:
  Acks(MPI_Comm comm, int tag) : comm_(comm), tag_(tag) {}
  // Starts sending `id` to `peer`.
  [[nodiscard]] Status send(int peer, int64_t id);
  // Calls on(id) for every acknowledgement that has arrived, and retires sends that completed.
  [[nodiscard]] Status poll(const std::function<void(int64_t)>& on);
  bool sending() const { return !sending_.empty(); }

 private:
  MPI_Comm comm_;
  int tag_;
  std::deque<std::pair<MPI_Request, std::unique_ptr<int64_t>>> sending_;
};

}  // namespace tandem::mpi
