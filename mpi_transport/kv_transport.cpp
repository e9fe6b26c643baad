#include "mpi_transport/kv_transport.h"

#include <string>
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

Status check_post(int peer, int size, std::span<const int32_t> src, std::span<const int32_t> dst, int64_t our_blocks,
                  int64_t their_blocks, std::size_t notification_bytes, std::size_t max_notification) {
  if (peer < 0 || peer >= size) return Status(StatusCode::kInvalidArgument, "no peer " + std::to_string(peer));
  if (notification_bytes > max_notification)
    return Status(StatusCode::kInvalidArgument, "a notification of " + std::to_string(notification_bytes) +
                                                    " bytes is over the transport's " + std::to_string(max_notification));
  if (src.size() != dst.size())
    return Status(StatusCode::kInvalidArgument, "src and dst block lists differ in length");
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i] < 0 || src[i] >= our_blocks || dst[i] < 0 || dst[i] >= their_blocks)
      return Status(StatusCode::kOutOfRange, "block id outside the pool");
  }
  return Status();
}

}  // namespace tandem::mpi
