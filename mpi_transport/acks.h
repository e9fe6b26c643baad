// Remote-completion acknowledgements of the two-sided transports (MPI
// two-sided, NCCL): the target sends a transfer's id back over MPI once the
// blocks have landed; the sender learns of it in poll(). Never blocks.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "common/status.h"

namespace tandem::mpi {

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
