// The workers' KV transport, chosen from transport.backend and
// model.backend, and opened (collective over the workers).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "mpi_transport/device_pool.h"
#include "launcher/config/config.h"
#include "mpi_transport/kv_transport.h"

namespace tandem::launcher {

// The transport that moves KV for workers on model.backend: as asked, but
// "auto" on a GPU is NCCL where built, else two-sided MPI staged through host
// memory (one-sided windows would expose host memory, not the GPU's pool);
// also two-sided where prefill and decode run at two tensor-parallel widths
// (`two_widths`): NCCL moves whole blocks, not the row slices that needs.
TransportKind transport_for(const Choices& c, bool two_widths = false);

// How a host-memory transport reaches a pool on model.backend's device; empty for cpu.
mpi::DevicePool staging_pool(const std::string& model_backend);

// The KV transport of the workers (collective over them). auto: one-sided RMA
// where every worker can create its window, else two-sided MPI for all. With
// a device pool (GPU workers), two-sided MPI staged through host memory.
// libfabric: over `provider` ("" for the default). Throws tandem::Error (one line).
std::unique_ptr<mpi::KvTransport> open_transport(TransportKind kind, MPI_Comm workers, std::size_t block_bytes,
                                                 int64_t blocks, void** base, const mpi::DevicePool& device,
                                                 const std::string& provider = "");

}  // namespace tandem::launcher
