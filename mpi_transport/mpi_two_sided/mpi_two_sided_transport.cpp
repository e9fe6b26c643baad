#include "mpi_transport/mpi_two_sided/mpi_two_sided_transport.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "common/big_alloc.h"
#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {
namespace {
constexpr int kTagData = 1;
constexpr int kTagAck = 2;
}  // namespace

MpiTwoSidedTransport::MpiTwoSidedTransport(MPI_Comm comm, DevicePool device)
    : device_(std::move(device)), staging_(device_.allocate_host) {
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
  const std::size_t bytes = block_bytes * static_cast<std::size_t>(n_blocks);
  std::string failed;
  try {
    if (device_) pool_memory_ = device_.allocate(bytes);
    else pool_memory_ = allocate_big(bytes);
    if (!pool_memory_) failed = "could not allocate the KV pool";
  } catch (const std::bad_alloc&) {
    failed = "out of memory allocating the KV pool; lower kv.memory_gib";
  } catch (const std::exception& e) {
    failed = e.what();
  }
  // Every rank learns whether every pool was made before the collective below:
  // a rank that returned alone would leave the others in MPI_Allgather.
  int all_made = failed.empty();
  TANDEM_MPI(MPI_Allreduce(MPI_IN_PLACE, &all_made, 1, MPI_INT, MPI_MIN, comm_));
  if (!failed.empty()) return Status(StatusCode::kResourceExhausted, failed);
  if (!all_made) return Status(StatusCode::kResourceExhausted, "another worker could not allocate its KV pool");
  pool_ = static_cast<uint8_t*>(pool_memory_.get());
  peer_blocks_.resize(static_cast<std::size_t>(size_));
  TANDEM_MPI(MPI_Allgather(&n_blocks_, 1, MPI_INT64_T, peer_blocks_.data(), 1, MPI_INT64_T, comm_));
  *base = pool_;
  return Status();
}

void MpiTwoSidedTransport::copy_blocks(int32_t block, int32_t count, uint8_t* host, bool to_pool) {
  uint8_t* at = pool_ + static_cast<std::size_t>(block) * block_bytes_;
  const std::size_t bytes = static_cast<std::size_t>(count) * block_bytes_;
  if (device_) device_.copy(to_pool ? at : host, to_pool ? host : at, bytes, to_pool);
  else std::memcpy(to_pool ? at : host, to_pool ? host : at, bytes);
}

Status MpiTwoSidedTransport::post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                                  Transfer& transfer) {
  if (!pool_) return Status(StatusCode::kUnavailable, "pool not created");
  TANDEM_RETURN_IF_ERROR(
      check_post(peer, size_, src, dst, n_blocks_, peer >= 0 && peer < size_ ? peer_blocks_[static_cast<std::size_t>(peer)] : 0));
  transfer = Transfer{peer, src.size() * block_bytes_, src.empty(), 0};
  if (src.empty()) return Status();
  const int64_t id = next_id_++;
  // Pack every message first (a copy from the device may throw: nothing is in flight yet), then send them.
  const std::size_t per_message = std::max<std::size_t>(1, max_message_bytes_ / block_bytes_);
  Outgoing o;
  for (std::size_t first = 0; first < src.size(); first += per_message) {
    const std::size_t n = std::min(per_message, src.size() - first);
    Message msg;
    msg.bytes = 12 + 4 * n + n * block_bytes_;
    msg.buffer = staging_.take(msg.bytes);
    uint8_t* m = msg.buffer.data();
    const std::size_t header = 12 + 4 * n;
    const auto count = static_cast<int32_t>(n);
    std::memcpy(m, &id, 8);
    std::memcpy(m + 8, &count, 4);
    std::memcpy(m + 12, dst.data() + first, 4 * n);
    // The message's data is in src order, so a run of consecutive src ids is one copy.
    for (std::size_t i = 0; i < n;) {
      std::size_t k = 1;
      while (i + k < n && src[first + i + k] == src[first + i] + static_cast<int32_t>(k)) ++k;
      copy_blocks(src[first + i], static_cast<int32_t>(k), m + header + i * block_bytes_, false);
      i += k;
    }
    o.messages.push_back(std::move(msg));
  }
  for (std::size_t k = 0; k < o.messages.size(); ++k) {
    Message& msg = o.messages[k];
    if (int rc = MPI_Isend(msg.buffer.data(), static_cast<int>(msg.bytes), MPI_BYTE, peer, kTagData, comm_, &msg.request);
        rc != MPI_SUCCESS) {
      // The messages already posted stay in flight (and keep their buffers); this transfer never completes.
      o.messages.resize(k);
      o.unsent = static_cast<int>(k);
      o.unacked = static_cast<int>(k) + 1;
      outgoing_.emplace(id, std::move(o));
      return mpi_status(rc, "MPI_Isend", __FILE__, __LINE__);
    }
  }
  o.unsent = o.unacked = static_cast<int>(o.messages.size());
  outgoing_.emplace(id, std::move(o));
  transfer.backend_handle = id;
  return Status();
}

Status MpiTwoSidedTransport::test(Transfer& transfer) {
  if (transfer.done) return Status();
  TANDEM_RETURN_IF_ERROR(progress());
  auto it = outgoing_.find(transfer.backend_handle);
  if (it == outgoing_.end()) return Status(StatusCode::kNotFound, "unknown transfer");
  if (it->second.unsent == 0 && it->second.unacked == 0) {
    transfer.done = true;
    outgoing_.erase(it);
  }
  return Status();
}

Status MpiTwoSidedTransport::progress() {
  // Our sends.
  for (auto& [id, o] : outgoing_) {
    for (Message& msg : o.messages) {
      if (msg.request == MPI_REQUEST_NULL) continue;
      int done = 0;
      TANDEM_MPI(MPI_Test(&msg.request, &done, MPI_STATUS_IGNORE));  // sets the request to null when done
      if (!done) continue;
      --o.unsent;
      staging_.give_back(std::exchange(msg.buffer, {}));
    }
  }
  // Acknowledgements of our messages (and of our acknowledgements, sent).
  TANDEM_RETURN_IF_ERROR(acks_->poll([&](int64_t id) {
    if (auto it = outgoing_.find(id); it != outgoing_.end()) --it->second.unacked;
  }));
  return receive_waiting_data();
}

// Transfers to us, one message at a time into one staging buffer: place the
// blocks (a run of consecutive destination ids is one copy), then acknowledge.
Status MpiTwoSidedTransport::receive_waiting_data() {
  for (;;) {
    int flag = 0, size = 0;
    MPI_Status st;
    TANDEM_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kTagData, comm_, &flag, &st));
    if (!flag) return Status();
    MPI_Get_count(&st, MPI_BYTE, &size);
    if (incoming_.capacity < static_cast<std::size_t>(size)) {
      staging_.give_back(std::exchange(incoming_, {}));
      incoming_ = staging_.take(static_cast<std::size_t>(size));
    }
    uint8_t* m = incoming_.data();
    TANDEM_MPI(MPI_Recv(m, size, MPI_BYTE, st.MPI_SOURCE, kTagData, comm_, MPI_STATUS_IGNORE));
    int64_t id = 0;
    int32_t count = 0;
    if (size >= 12) std::memcpy(&id, m, 8), std::memcpy(&count, m + 8, 4);
    const std::size_t header = 12 + 4 * static_cast<std::size_t>(std::max(count, 0));
    if (size < 12 || count < 0 ||
        static_cast<std::size_t>(size) != header + static_cast<std::size_t>(count) * block_bytes_)
      return Status(StatusCode::kInternal, "a KV message from rank " + std::to_string(st.MPI_SOURCE) + " of " +
                                               std::to_string(size) + " bytes does not hold the " +
                                               std::to_string(count) + " blocks it announces");
    std::vector<int32_t> dst(static_cast<std::size_t>(count));
    std::memcpy(dst.data(), m + 12, 4 * dst.size());
    for (int32_t d : dst)
      if (d < 0 || d >= n_blocks_)
        return Status(StatusCode::kInternal, "a KV message from rank " + std::to_string(st.MPI_SOURCE) + " names block " +
                                                 std::to_string(d) + ", outside this pool");
    for (std::size_t i = 0; i < dst.size();) {
      std::size_t n = 1;
      while (i + n < dst.size() && dst[i + n] == dst[i] + static_cast<int32_t>(n)) ++n;
      copy_blocks(dst[i], static_cast<int32_t>(n), m + header + i * block_bytes_, true);
      i += n;
    }
    TANDEM_RETURN_IF_ERROR(acks_->send(st.MPI_SOURCE, id));
  }
}

Status MpiTwoSidedTransport::destroy() {
  // Finish what is in flight (acknowledgements included) before the pool goes.
  for (int i = 0; i < 1000000 && (acks_->sending() || !outgoing_.empty()); ++i) {
    TANDEM_RETURN_IF_ERROR(progress());
    std::erase_if(outgoing_, [](const auto& e) { return e.second.unsent == 0 && e.second.unacked == 0; });
  }
  TANDEM_MPI(MPI_Barrier(comm_));
  return Status();
}

}  // namespace tandem::mpi
