#include "mpi_transport/kv_transport.h"

#include <vector>

namespace tandem::mpi {

std::vector<BlockRun> coalesce(std::span<const int32_t> src, std::span<const int32_t> dst) {
  std::vector<BlockRun> runs;
  for (std::size_t i = 0; i < src.size() && i < dst.size(); ++i) {
    if (!runs.empty() && runs.back().src + runs.back().count == src[i] && runs.back().dst + runs.back().count == dst[i])
      ++runs.back().count;
    else
      runs.push_back({src[i], dst[i], 1});
  }
  return runs;
}

}  // namespace tandem::mpi
