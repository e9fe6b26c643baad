// Notifications of the MPI-based transports (MPI RMA, NCCL): a small message
// [id][aborted][bytes] per transfer, sent by the transfer's sender once its
// data is at the target (or it gave up), received by the target's
// progress(). Sends never block: their buffers are kept until MPI is done
// with them. Also the non-blocking receive loop the backends share.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
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
    if (int rc = MPI_Get_count(&st, type, &count); rc != MPI_SUCCESS)
      return mpi_status(rc, "MPI_Get_count", __FILE__, __LINE__);
    std::vector<T> msg(static_cast<std::size_t>(count));
    if (int rc = MPI_Recv(msg.data(), count, type, st.MPI_SOURCE, tag, comm, MPI_STATUS_IGNORE); rc != MPI_SUCCESS)
      return mpi_status(rc, "MPI_Recv", __FILE__, __LINE__);
    TANDEM_RETURN_IF_ERROR(on(st.MPI_SOURCE, msg));
  }
}

// A backend's collective end: keeps calling progress() (placing what others
// send, sending its own notices) until nothing of its own is pending and
// every rank has got that far (a rank waiting in a blocking barrier would
// leave a sender's large message unmatched for ever). Backs off meanwhile.
[[nodiscard]] Status finish_in_flight(MPI_Comm comm, const std::function<Status()>& progress,
                                      const std::function<bool()>& pending);

struct Notice {
  int peer = -1;
  int64_t id = 0;
  bool aborted = false;
  std::vector<uint8_t> bytes;
};

// [int64 id][uint8 aborted][bytes...]
std::vector<uint8_t> pack_notice(int64_t id, bool aborted, std::span<const uint8_t> bytes);
// The same into `m` (its capacity reused).
void pack_notice(int64_t id, bool aborted, std::span<const uint8_t> bytes, std::vector<uint8_t>& m);
// False when `m` is too short to be a notice.
bool unpack_notice(int peer, const std::vector<uint8_t>& m, Notice& out);

class Notices {
 public:
  Notices(MPI_Comm comm, int tag) : comm_(comm), tag_(tag) {}
  // Starts sending the notice of transfer `id` to `peer`.
  [[nodiscard]] Status send(int peer, int64_t id, bool aborted, std::span<const uint8_t> bytes);
  // Starts sending a notice already packed (pack_notice); `packed` is left
  // holding a spare buffer (empty, its capacity kept) for the next one.
  [[nodiscard]] Status send_packed(int peer, std::vector<uint8_t>& packed);
  // Appends the notices that arrived, and retires sends that completed.
  [[nodiscard]] Status poll(std::vector<Notice>& arrived);
  bool sending() const { return !sending_.empty(); }

 private:
  MPI_Comm comm_;
  int tag_;
  std::deque<std::pair<MPI_Request, std::vector<uint8_t>>> sending_;
  std::vector<std::vector<uint8_t>> spare_;  // buffers of sends that completed, for the next ones
};

}  // namespace tandem::mpi
