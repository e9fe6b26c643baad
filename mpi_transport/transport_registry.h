// KV transports that are built only with optional hardware, by name: the one
// file that knows (TANDEM_NCCL appears nowhere else in mpi_transport/).
#pragma once

#include <mpi.h>

#include <memory>
#include <string_view>

#include "mpi_transport/kv_transport.h"

namespace tandem::mpi {

// "nccl" (TANDEM_NCCL), else null: not built into this tandem.
std::unique_ptr<KvTransport> make_optional_transport(std::string_view name, MPI_Comm comm);
// Whether make_optional_transport(name, ...) would make one.
bool optional_transport_built(std::string_view name);

}  // namespace tandem::mpi
