// The one checking wrapper for HDF5 calls (as mpi_check.h is for MPI): RAII
// handles, and the library's own innermost error text for a failed call.
// HDF5's automatic error-stack printing is switched off on first use, so a
// bad file costs one line of ours, not a page of the library's.
#pragma once

#include <hdf5.h>

#include <string>

namespace tandem::kv {

// An HDF5 identifier closed by its kind's close function (file, dataset, dataspace, ...).
class H5Id {
 public:
  H5Id() = default;
  explicit H5Id(hid_t id) : id_(id) {}
  H5Id(H5Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Switches off HDF5's own error printing (idempotent, process-wide).
void h5_quiet();
// The most specific message on HDF5's error stack, e.g. "truncated file: eof = 1024, ...".
std::string h5_error();

}  // namespace tandem::kv
