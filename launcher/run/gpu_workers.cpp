#include "launcher/run/gpu_workers.h"

#include <algorithm>
#include <array>
#include <vector>

#include "common/error.h"
#include "launcher/run/device_binding.h"
#include "runtime/engine/backend_registry.h"

namespace tandem::launcher {

std::string bind_worker_device(const std::string& backend, int rank, int world_size, MPI_Comm local, int local_rank,
                               bool router_here) {
  std::string error, uuid;
  if (rank != 0 || world_size == 1) {
    try {
      runtime::bind_device(backend, world_size == 1 ? 0 : worker_device_index(local_rank, router_here));
      uuid = runtime::device_uuid(backend);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (world_size == 1) return error;
  int local_size = 1;
  MPI_Comm_size(local, &local_size);
  constexpr int kUuid = 64;
  std::vector<char> mine(kUuid, '\0'), all(static_cast<std::size_t>(kUuid * local_size));
  std::copy_n(uuid.begin(), std::min<std::size_t>(uuid.size(), kUuid - 1), mine.begin());
  std::vector<int> ranks(static_cast<std::size_t>(local_size));
  MPI_Allgather(mine.data(), kUuid, MPI_CHAR, all.data(), kUuid, MPI_CHAR, local);
  MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, local);
  std::vector<std::string> uuids;
  for (int i = 0; i < local_size; ++i) uuids.emplace_back(all.data() + static_cast<std::ptrdiff_t>(i) * kUuid);
  return error.empty() ? shared_device_error(rank, ranks, uuids) : error;
}

std::string first_worker_gpu(const std::string& backend, int rank, MPI_Comm world) {
  std::array<char, 256> name{};
  if (rank == 1) {
    std::string mine;
    try {
      mine = runtime::device_name(backend);
    } catch (const Error&) {  // only a label for the planner: never worth a hang in the broadcast
    }
    std::copy_n(mine.begin(), std::min<std::size_t>(mine.size(), name.size() - 1), name.begin());
  }
  MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 1, world);
  return name.data();
}

}  // namespace tandem::launcher
