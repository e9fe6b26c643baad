#include "launcher/run/transport_setup.h"

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "mpi_transport/mpi_rma/mpi_rma_transport.h"
#include "mpi_transport/mpi_two_sided/mpi_two_sided_transport.h"
#include "mpi_transport/transport_registry.h"
#include "runtime/engine/backend_registry.h"

namespace tandem::launcher {

TransportKind transport_for(const Choices& c, bool two_widths) {
  if (c.on_cpu() || c.transport != TransportKind::kAuto) return c.transport;
  return mpi::optional_transport_built("nccl") && !two_widths ? TransportKind::kNccl : TransportKind::kMpiTwoSided;
}

mpi::DevicePool staging_pool(const std::string& model_backend) {
  mpi::DevicePool d;
  if (model_backend == "cpu") return d;
  d.allocate = [model_backend](std::size_t bytes) { return runtime::allocate_pool_memory(model_backend, bytes); };
  d.copy = runtime::pool_copy(model_backend);
  d.copy_rows = runtime::pool_copy_rows(model_backend);
  d.allocate_host = [model_backend](std::size_t bytes) { return runtime::allocate_host_memory(model_backend, bytes); };
  return d;
}

std::unique_ptr<mpi::KvTransport> open_transport(TransportKind kind, MPI_Comm workers, std::size_t block_bytes,
                                                 int64_t blocks, void** base, const mpi::DevicePool& device,
                                                 const std::string& provider) {
  if (kind == TransportKind::kNccl) {
    auto nccl = mpi::make_optional_transport("nccl", workers);
    if (!nccl) throw Error("transport.backend = \"nccl\": this tandem was built without NCCL (cmake -DTANDEM_NCCL=ON)");
    if (Status st = nccl->allocate_pool(block_bytes, blocks, base); !st.ok()) throw Error("NCCL transport: " + st.to_string());
    return nccl;
  }
  if (kind == TransportKind::kLibfabric) {
    auto fabric = mpi::make_optional_transport("libfabric", workers, provider);
    if (!fabric) throw Error("transport.backend = \"libfabric\": this tandem was built without libfabric");
    if (Status st = fabric->allocate_pool(block_bytes, blocks, base); !st.ok())
      throw Error("transport.backend = \"libfabric\": " + st.message() +
                  "; set transport.libfabric_provider to one of those found, or use \"auto\"");
    return fabric;
  }
  if (device) {
    if (kind != TransportKind::kMpiTwoSided)
      throw Error(std::string("internal: transport ") + transport_name(kind) + " cannot reach a device pool");
    auto staged = std::make_unique<mpi::MpiTwoSidedTransport>(workers, device);
    if (Status st = staged->allocate_pool(block_bytes, blocks, base); !st.ok()) throw Error("KV transport: " + st.to_string());
    return staged;
  }
  if (kind == TransportKind::kMpiRma || kind == TransportKind::kAuto) {
    auto rma = std::make_unique<mpi::MpiRmaTransport>(workers);
    const Status st = rma->allocate_pool(block_bytes, blocks, base);
    int ok = st.ok() ? 1 : 0, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, workers);
    if (all_ok) return rma;
    if (st.ok()) (void)rma->destroy();
    if (kind == TransportKind::kMpiRma)
      throw Error("could not create the KV window (" + st.to_string() + "); set transport.backend = \"auto\"");
    int wrank = 0;
    MPI_Comm_rank(workers, &wrank);
    if (wrank == 0) spdlog::warn("one-sided MPI windows are not available here; KV moves by two-sided MPI instead");
  }
  auto two = std::make_unique<mpi::MpiTwoSidedTransport>(workers);
  if (Status st = two->allocate_pool(block_bytes, blocks, base); !st.ok()) throw Error("KV transport: " + st.to_string());
  return two;
}

}  // namespace tandem::launcher
