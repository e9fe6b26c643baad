// KV transports that are built only with optional hardware, by name: the one
// file that knows (TANDEM_NCCL and TANDEM_LIBFABRIC appear nowhere else in mpi_transport/).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <string_view>

#include "mpi_transport/kv_transport.h"
#include "runtime/engine/device_group.h"

namespace tandem::mpi {

// "nccl" (TANDEM_NCCL) or "libfabric" (TANDEM_LIBFABRIC; over `provider`, "" for
// the default), else null: not built into this tandem.
std::unique_ptr<KvTransport> make_optional_transport(std::string_view name, MPI_Comm comm,
                                                     const std::string& provider = "");
// Whether make_optional_transport(name, ...) would make one.
bool optional_transport_built(std::string_view name);

// A tensor-parallel group's device exchange over NCCL (nccl/nccl_tp_group.h),
// collective over `group`; null when this tandem was built without NCCL.
std::unique_ptr<runtime::DeviceGroup> make_device_group(MPI_Comm group);

}  // namespace tandem::mpi
