#include "mpi_transport/kv_transport.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace tandem::mpi {

std::vector<BlockRun> coalesce(std::span<const int32_t> src, std::span<const int32_t> dst) {
  std::vector<BlockRun> runs;
  coalesce(src, dst, runs);
  return runs;
}

void coalesce(std::span<const int32_t> src, std::span<const int32_t> dst, std::vector<BlockRun>& runs) {
  runs.clear();
  for (std::size_t i = 0; i < src.size() && i < dst.size(); ++i) {
    if (!runs.empty() && runs.back().src + runs.back().count == src[i] && runs.back().dst + runs.back().count == dst[i])
      ++runs.back().count;
    else
      runs.push_back({src[i], dst[i], 1});
  }
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

std::vector<uint64_t> capacities(const std::vector<int64_t>& blocks, const std::vector<uint64_t>& block_bytes) {
  std::vector<uint64_t> out(blocks.size());
  for (std::size_t r = 0; r < blocks.size(); ++r) out[r] = static_cast<uint64_t>(std::max<int64_t>(0, blocks[r])) * block_bytes[r];
  return out;
}

Status check_relayout(int peer, int size, std::size_t capacity, std::size_t block_bytes, int64_t n_blocks) {
  if (peer < 0 || peer >= size) return Status(StatusCode::kInvalidArgument, "no peer " + std::to_string(peer));
  if (block_bytes == 0 || n_blocks < 0 || block_bytes * static_cast<std::size_t>(n_blocks) > capacity)
    return Status(StatusCode::kOutOfRange, std::to_string(n_blocks) + " blocks of " + std::to_string(block_bytes) +
                                               " bytes do not fit rank " + std::to_string(peer) + "'s pool of " +
                                               std::to_string(capacity) + " bytes");
  return Status();
}

Status relayout_peer(int peer, std::size_t block_bytes, int64_t n_blocks, const std::vector<uint64_t>& capacity,
                     std::vector<int64_t>& blocks, std::vector<uint64_t>& bytes) {
  const int size = static_cast<int>(capacity.size());
  TANDEM_RETURN_IF_ERROR(check_relayout(peer, size, peer >= 0 && peer < size ? capacity[static_cast<std::size_t>(peer)] : 0,
                                        block_bytes, n_blocks));
  blocks[static_cast<std::size_t>(peer)] = n_blocks;
  bytes[static_cast<std::size_t>(peer)] = block_bytes;
  return Status();
}

Status check_block_bytes(std::size_t ours, std::size_t theirs, const RowSlice* s) {
  if (!s) {
    if (ours == theirs) return Status();
    return Status(StatusCode::kInvalidArgument, "the peer's blocks are " + std::to_string(theirs) + " bytes and ours " +
                                                    std::to_string(ours) + ": post a slice of them (post_slice)");
  }
  const auto rows = static_cast<std::size_t>(std::max<int64_t>(s->rows, 0));
  if (rows == 0 || ours % rows != 0 || theirs % rows != 0)
    return Status(StatusCode::kInvalidArgument, std::to_string(s->rows) + " rows do not divide blocks of " +
                                                    std::to_string(ours) + " and " + std::to_string(theirs) + " bytes");
  if (s->src_offset + s->bytes > ours / rows || s->dst_offset + s->bytes > theirs / rows)
    return Status(StatusCode::kOutOfRange, "a slice of " + std::to_string(s->bytes) + " bytes at " +
                                               std::to_string(s->src_offset) + " -> " + std::to_string(s->dst_offset) +
                                               " passes the end of a row (" + std::to_string(ours / rows) + " -> " +
                                               std::to_string(theirs / rows) + " bytes)");
  return Status();
}

void pack_slices(const uint8_t* pool, std::size_t block_bytes, std::span<const int32_t> blocks, const RowSlice& s,
                 uint8_t* out) {
  const std::size_t row = block_bytes / static_cast<std::size_t>(s.rows);
  for (int32_t b : blocks) {
    const uint8_t* at = pool + static_cast<std::size_t>(b) * block_bytes + s.src_offset;
    for (int64_t r = 0; r < s.rows; ++r, out += s.bytes) std::memcpy(out, at + static_cast<std::size_t>(r) * row, s.bytes);
  }
}

void unpack_slices(uint8_t* pool, std::size_t block_bytes, std::span<const int32_t> blocks, const RowSlice& s,
                   const uint8_t* in) {
  const std::size_t row = block_bytes / static_cast<std::size_t>(s.rows);
  for (int32_t b : blocks) {
    uint8_t* at = pool + static_cast<std::size_t>(b) * block_bytes + s.dst_offset;
    for (int64_t r = 0; r < s.rows; ++r, in += s.bytes) std::memcpy(at + static_cast<std::size_t>(r) * row, in, s.bytes);
  }
}

}  // namespace tandem::mpi
