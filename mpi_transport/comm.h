// Communicators as values: a Comm owns one MPI communicator and frees it
// when it goes. MPI_Comm_free is collective, so it is skipped while an
// exception unwinds (the job is then ending with MPI_Abort, and a free could
// wait for ranks that never come); on the normal path every rank frees its
// communicators in the same order, as their owners go.
#pragma once

#include <mpi.h>

#include <utility>

namespace tandem::mpi {

class Comm {
 public:
  Comm() = default;
  explicit Comm(MPI_Comm c) : c_(c) {}
  ~Comm() { reset(); }
  Comm(Comm&& o) noexcept : c_(std::exchange(o.c_, MPI_COMM_NULL)) {}
  Comm& operator=(Comm&& o) noexcept {
    if (this != &o) {
      reset();
      c_ = std::exchange(o.c_, MPI_COMM_NULL);
    }
    return *this;
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  MPI_Comm get() const { return c_; }
  explicit operator bool() const { return c_ != MPI_COMM_NULL; }
  // Hands the communicator to a new owner.
  MPI_Comm release() { return std::exchange(c_, MPI_COMM_NULL); }
  void reset();

 private:
  MPI_Comm c_ = MPI_COMM_NULL;
};

// MPI_Comm_split of `parent` (color MPI_UNDEFINED: an empty Comm), errors set
// to return; throws tandem::Error when the call fails.
Comm split(MPI_Comm parent, int color, int key);
// This node's ranks of `parent` (MPI_COMM_TYPE_SHARED).
Comm split_node(MPI_Comm parent, int key);

}  // namespace tandem::mpi
