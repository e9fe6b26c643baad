#include "mpi_transport/mpi_two_sided/mpi_two_sided_transport.h"

#include <cstring>

#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {
namespace {
constexpr int kTagData = 1;
constexpr int kTagAck = 2;
}  // namespace

MpiTwoSidedTransport::MpiTwoSidedTransport(MPI_Comm comm) {
  MPI_Comm_dup(comm, &comm_);  // a private channel: no tag can collide with other traffic
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  acks_ = std::make_unique<Acks>(comm_, kTagAck);
}

MpiTwoSidedTransport::~MpiTwoSidedTransport() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Status MpiTwoSidedTransport::create_pool(std::size_t block_bytes, int64_t n_blocks, void** base) {
  block_bytes_ = block_bytes;
  n_blocks_ = n_blocks;
  pool_.reset(new uint8_t[block_bytes * static_cast<std::size_t>(n_blocks)]());
  peer_blocks_.resize(static_cast<std::size_t>(size_));
  TANDEM_MPI(MPI_Allgather(&n_blocks_, 1, MPI_INT64_T, peer_blocks_.data(), 1, MPI_INT64_T, comm_));
  *base = pool_.get();
  return Status();
}

Status MpiTwoSidedTransport::post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                                  Transfer& transfer) {
  if (!pool_) return Status(StatusCode::kUnavailable, "pool not created");
  TANDEM_RETURN_IF_ERROR(
      check_post(peer, size_, src, dst, n_blocks_, peer >= 0 && peer < size_ ? peer_blocks_[static_cast<std::size_t>(peer)] : 0));
  transfer = Transfer{peer, src.size() * block_bytes_, src.empty(), 0};
  if (src.empty()) return Status();
  const int64_t id = next_id_++;
  Outgoing& o = outgoing_[id];
  const std::size_t header = 8 + 4 + 4 * dst.size();
  o.bytes.resize(header + src.size() * block_bytes_);
  std::memcpy(o.bytes.data(), &id, 8);
  const auto count = static_cast<int32_t>(dst.size());
  std::memcpy(o.bytes.data() + 8, &count, 4);
  std::memcpy(o.bytes.data() + 12, dst.data(), 4 * dst.size());
  for (std::size_t i = 0; i < src.size(); ++i)
    std::memcpy(o.bytes.data() + header + i * block_bytes_, pool_.get() + static_cast<std::size_t>(src[i]) * block_bytes_,
                block_bytes_);
  // MPI counts are ints; a transfer over 2 GiB would need splitting, far beyond one prompt's KV.
  TANDEM_MPI(MPI_Isend(o.bytes.data(), static_cast<int>(o.bytes.size()), MPI_BYTE, peer, kTagData, comm_, &o.request));
  transfer.backend_handle = id;
  return Status();
}

Status MpiTwoSidedTransport::test(Transfer& transfer) {
  if (transfer.done) return Status();
  TANDEM_RETURN_IF_ERROR(progress());
  auto it = outgoing_.find(transfer.backend_handle);
  if (it == outgoing_.end()) return Status(StatusCode::kNotFound, "unknown transfer");
  if (it->second.sent && it->second.acked) {
    transfer.done = true;
    outgoing_.erase(it);
  }
  return Status();
}

Status MpiTwoSidedTransport::progress() {
  // Our sends.
  for (auto& [id, o] : outgoing_) {
    if (o.sent) continue;
    int done = 0;
    TANDEM_MPI(MPI_Test(&o.request, &done, MPI_STATUS_IGNORE));
    o.sent = done != 0;
  }
  // Acknowledgements of our transfers (and of our acknowledgements, sent).
  TANDEM_RETURN_IF_ERROR(acks_->poll([&](int64_t id) {
    if (auto it = outgoing_.find(id); it != outgoing_.end()) it->second.acked = true;
  }));
  // Transfers to us: place the blocks, then acknowledge.
  return receive_waiting<uint8_t>(comm_, kTagData, MPI_BYTE, [&](int peer, const std::vector<uint8_t>& msg) {
    int64_t id = 0;
    int32_t count = 0;
    std::memcpy(&id, msg.data(), 8);
    std::memcpy(&count, msg.data() + 8, 4);
    const std::size_t header = 12 + 4 * static_cast<std::size_t>(count);
    for (int32_t i = 0; i < count; ++i) {
      int32_t d = 0;
      std::memcpy(&d, msg.data() + 12 + 4 * i, 4);
      std::memcpy(pool_.get() + static_cast<std::size_t>(d) * block_bytes_,
                  msg.data() + header + static_cast<std::size_t>(i) * block_bytes_, block_bytes_);
    }
    return acks_->send(peer, id);
  });
}

Status MpiTwoSidedTransport::destroy() {
  // Finish what is in flight (acknowledgements included) before the pool goes.
  for (int i = 0; i < 1000000 && (acks_->sending() || !outgoing_.empty()); ++i) TANDEM_RETURN_IF_ERROR(progress());
  TANDEM_MPI(MPI_Barrier(comm_));
  return Status();
}

}  // namespace tandem::mpi
