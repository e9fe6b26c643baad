#include "mpi_transport/mpi_two_sided/mpi_two_sided_transport.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "common/big_alloc.h"
#include "mpi_transport/mpi_check.h"
#include "mpi_transport/mpi_env.h"
#include "mpi_transport/notices.h"

namespace tandem::mpi {
namespace {
constexpr int kTagData = 1;
constexpr uint8_t kData = 0, kNotice = 1, kSlices = 2;
constexpr std::size_t kDataHeader = 13;   // [u8 kData][int64 id][int32 count]
constexpr std::size_t kSliceHeader = 37;  // and [int64 rows][int64 dst offset][int64 bytes]
}  // namespace

MpiTwoSidedTransport::MpiTwoSidedTransport(MPI_Comm comm, DevicePool device)
    : device_(std::move(device)), staging_(device_.allocate_host) {
  MPI_Comm_dup(comm, &comm_);  // a private channel: no tag can collide with other traffic
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiTwoSidedTransport::~MpiTwoSidedTransport() {
  // A message still arriving (its sender lost) may write into its buffer as long as MPI runs: the buffer stays.
  if (receiving_.request != MPI_REQUEST_NULL) (void)new std::shared_ptr<void>(incoming_.memory);  // left for MPI
  if (comm_ != MPI_COMM_NULL && std::uncaught_exceptions() == 0) MPI_Comm_free(&comm_);  // not while the job aborts
}

Status MpiTwoSidedTransport::allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) {
  std::string failed;
  try {
    const std::size_t bytes = block_bytes * static_cast<std::size_t>(n_blocks);
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
  TANDEM_RETURN_IF_ERROR(setup(block_bytes, n_blocks));
  *base = pool_;
  return Status();
}

Status MpiTwoSidedTransport::register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) {
  int all_given = base != nullptr || n_blocks == 0;
  TANDEM_MPI(MPI_Allreduce(MPI_IN_PLACE, &all_given, 1, MPI_INT, MPI_MIN, comm_));
  if (!all_given) return Status(StatusCode::kInvalidArgument, "a rank registered no pool memory");
  pool_ = static_cast<uint8_t*>(base);
  return setup(block_bytes, n_blocks);
}

Status MpiTwoSidedTransport::setup(std::size_t block_bytes, int64_t n_blocks) {
  block_bytes_ = block_bytes;
  n_blocks_ = n_blocks;
  peer_blocks_.resize(static_cast<std::size_t>(size_));
  TANDEM_MPI(MPI_Allgather(&n_blocks_, 1, MPI_INT64_T, peer_blocks_.data(), 1, MPI_INT64_T, comm_));
  peer_block_bytes_.resize(static_cast<std::size_t>(size_));
  const uint64_t mine = block_bytes_;
  TANDEM_MPI(MPI_Allgather(&mine, 1, MPI_UINT64_T, peer_block_bytes_.data(), 1, MPI_UINT64_T, comm_));
  peer_capacity_ = capacities(peer_blocks_, peer_block_bytes_);
  return Status();
}

Status MpiTwoSidedTransport::relayout(int peer, std::size_t block_bytes, int64_t n_blocks) {
  TANDEM_RETURN_IF_ERROR(relayout_peer(peer, block_bytes, n_blocks, peer_capacity_, peer_blocks_, peer_block_bytes_));
  if (peer == rank_) block_bytes_ = block_bytes, n_blocks_ = n_blocks;
  return Status();
}

void MpiTwoSidedTransport::copy_blocks(int32_t block, int32_t count, uint8_t* host, bool to_pool) {
  uint8_t* at = pool_ + static_cast<std::size_t>(block) * block_bytes_;
  const std::size_t bytes = static_cast<std::size_t>(count) * block_bytes_;
  if (device_) device_.copy(to_pool ? at : host, to_pool ? host : at, bytes, to_pool);
  else std::memcpy(to_pool ? at : host, to_pool ? host : at, bytes);
}

void MpiTwoSidedTransport::copy_slices(std::span<const int32_t> blocks, const RowSlice& s, uint8_t* host,
                                       bool to_pool) {
  if (!device_) {
    if (to_pool) unpack_slices(pool_, block_bytes_, blocks, s, host);
    else pack_slices(pool_, block_bytes_, blocks, s, host);
    return;
  }
  // One strided copy a run of consecutive blocks: a block's rows are `pitch` apart, and so are the last row of
  // one block and the first of the next (pitch x rows = block_bytes), so a run is rows x its length rows.
  const std::size_t pitch = block_bytes_ / static_cast<std::size_t>(s.rows), each = static_cast<std::size_t>(s.rows) * s.bytes;
  for (std::size_t i = 0; i < blocks.size();) {
    std::size_t n = 1;
    while (i + n < blocks.size() && blocks[i + n] == blocks[i] + static_cast<int32_t>(n)) ++n;
    uint8_t* at = pool_ + static_cast<std::size_t>(blocks[i]) * block_bytes_ + (to_pool ? s.dst_offset : s.src_offset);
    device_.copy_rows(to_pool ? at : host, to_pool ? host : at, s.bytes, static_cast<std::size_t>(s.rows) * n, pitch,
                      to_pool);
    host += each * n;
    i += n;
  }
}

Status MpiTwoSidedTransport::send(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                                  const RowSlice* slice, std::span<const uint8_t> notification, XferId& id) {
  if (!pool_ && n_blocks_ == 0 && peer_blocks_.empty()) return Status(StatusCode::kUnavailable, "pool not created");
  TANDEM_RETURN_IF_ERROR(check_post(peer, size_, src, dst, n_blocks_,
                                    peer >= 0 && peer < size_ ? peer_blocks_[static_cast<std::size_t>(peer)] : 0,
                                    notification.size(), capabilities().max_notification_bytes));
  TANDEM_RETURN_IF_ERROR(check_block_bytes(block_bytes_, peer_block_bytes_[static_cast<std::size_t>(peer)], slice));
  if (slice && !capabilities().row_slices)
    return Status(StatusCode::kInvalidArgument, "mpi_two_sided moves slices of this device pool's blocks only with its "
                                                "row copies (DevicePool::copy_rows)");
  id = next_id_++;
  // What one block puts in a message: all of it, or its rows' slices.
  const std::size_t each = slice ? static_cast<std::size_t>(slice->rows) * slice->bytes : block_bytes_;
  const std::size_t head = slice ? kSliceHeader : kDataHeader;
  // Pack every message first (a copy from the device may throw: nothing is in flight yet), then send them.
  const std::size_t per_message = std::max<std::size_t>(1, max_message_bytes_ / std::max<std::size_t>(each, 1));
  Outgoing o;
  o.peer = peer;
  o.notification.assign(notification.begin(), notification.end());
  for (std::size_t first = 0; first < src.size(); first += per_message) {
    const std::size_t n = std::min(per_message, src.size() - first);
    Message msg;
    const std::size_t header = head + 4 * n;
    msg.bytes = header + n * each;
    msg.buffer = staging_.take(msg.bytes);
    uint8_t* m = msg.buffer.data();
    const auto count = static_cast<int32_t>(n);
    m[0] = slice ? kSlices : kData;
    std::memcpy(m + 1, &id, 8);
    std::memcpy(m + 9, &count, 4);
    std::memcpy(m + head, dst.data() + first, 4 * n);
    if (slice) {
      const int64_t geometry[3] = {slice->rows, static_cast<int64_t>(slice->dst_offset), static_cast<int64_t>(slice->bytes)};
      std::memcpy(m + kDataHeader, geometry, sizeof geometry);
      copy_slices(src.subspan(first, n), *slice, m + header, false);
      o.messages.push_back(std::move(msg));
      continue;
    }
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
      // The messages already posted stay in flight (and keep their buffers); the peer hears of an abort after them.
      o.messages.resize(k);
      o.unsent = static_cast<int>(k);
      o.aborted = true;
      outgoing_.emplace(id, std::move(o));
      return mpi_status(rc, "MPI_Isend", __FILE__, __LINE__);
    }
  }
  o.unsent = static_cast<int>(o.messages.size());
  outgoing_.emplace(id, std::move(o));
  return Status();  // it advances in poll() and progress(): an abort() until then still tells the peer
}

// Retires the transfer's completed sends; once none is left, sends its notice.
Status MpiTwoSidedTransport::advance(XferId id, Outgoing& o) {
  if (o.state != XferState::kPending) return Status();
  for (Message& msg : o.messages) {
    if (msg.request == MPI_REQUEST_NULL) continue;
    int done = 0;
    TANDEM_MPI(MPI_Test(&msg.request, &done, MPI_STATUS_IGNORE));  // sets the request to null when done
    if (!done) continue;
    --o.unsent;
    staging_.give_back(std::exchange(msg.buffer, {}));
  }
  if (o.unsent > 0) return Status();
  std::vector<uint8_t> notice = pack_notice(id, o.aborted, o.notification);
  notice.insert(notice.begin(), kNotice);
  notices_.emplace_back(MPI_REQUEST_NULL, std::move(notice));
  auto& [request, bytes] = notices_.back();
  TANDEM_MPI(MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, o.peer, kTagData, comm_, &request));
  o.messages.clear();
  o.notification.clear();
  o.state = o.aborted ? XferState::kAborted : XferState::kDone;
  return Status();
}

Status MpiTwoSidedTransport::poll(XferId id, XferState& state) {
  return poll_outgoing(outgoing_, id, state, [this](XferId i, Outgoing& o) { return advance(i, o); });
}

Status MpiTwoSidedTransport::abort(XferId id) {
  return abort_outgoing(outgoing_, id, [this](XferId i, Outgoing& o) { return advance(i, o); });
}

Status MpiTwoSidedTransport::progress(std::vector<Notification>& arrived) {
  for (auto& [id, o] : outgoing_) TANDEM_RETURN_IF_ERROR(advance(id, o));
  while (!notices_.empty()) {
    int done = 0;
    TANDEM_MPI(MPI_Test(&notices_.front().first, &done, MPI_STATUS_IGNORE));
    if (!done) break;
    notices_.pop_front();
  }
  return receive_waiting(arrived);
}

// Messages to us, in each sender's order, one at a time into one staging
// buffer: blocks are placed, notices handed over (after their data, which
// came first). Never waits: a message is matched (MPI_Improbe) and received
// (MPI_Imrecv), and one whose data is still on the way is finished by a
// later call. (A blocking receive after a probe waited for ever on a large
// message whose sender's node dropped off the network after its envelope.)
Status MpiTwoSidedTransport::receive_waiting(std::vector<Notification>& arrived) {
  for (;;) {
    if (receiving_.request == MPI_REQUEST_NULL) {
      int flag = 0, size = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status st;
      TANDEM_MPI(MPI_Improbe(MPI_ANY_SOURCE, kTagData, comm_, &flag, &message, &st));
      if (!flag) return Status();
      TANDEM_MPI(MPI_Get_count(&st, MPI_BYTE, &size));
      if (incoming_.capacity < static_cast<std::size_t>(size)) {
        staging_.give_back(std::exchange(incoming_, {}));
        incoming_ = staging_.take(static_cast<std::size_t>(size));
      }
      receiving_.source = st.MPI_SOURCE;
      receiving_.size = static_cast<std::size_t>(size);
      TANDEM_MPI(MPI_Imrecv(incoming_.data(), size, MPI_BYTE, &message, &receiving_.request));
    }
    int done = 0;
    TANDEM_MPI(MPI_Test(&receiving_.request, &done, MPI_STATUS_IGNORE));
    if (!done) return Status();  // the rest of it comes with a later call
    const uint8_t* m = incoming_.data();
    const int source = receiving_.source;
    const std::size_t size = receiving_.size;
    if (size >= 1 && m[0] == kNotice) {
      Notice n;
      if (!unpack_notice(source, std::vector<uint8_t>(m + 1, m + size), n))
        return Status(StatusCode::kInternal, "a KV notification from rank " + std::to_string(source) + " is malformed");
      arrived.push_back({n.peer, n.aborted, std::move(n.bytes)});
      continue;
    }
    TANDEM_RETURN_IF_ERROR(place(source, m, size));
  }
}

Status MpiTwoSidedTransport::place(int source, const uint8_t* m, std::size_t size) {
  int32_t count = -1;
  const bool sliced = size >= kSliceHeader && m[0] == kSlices;
  RowSlice slice;
  if ((size >= kDataHeader && m[0] == kData) || sliced) std::memcpy(&count, m + 9, 4);
  std::size_t each = block_bytes_;
  if (sliced) {
    int64_t geometry[3];
    std::memcpy(geometry, m + kDataHeader, sizeof geometry);
    slice = {geometry[0], 0, static_cast<std::size_t>(geometry[1]), static_cast<std::size_t>(geometry[2])};
    // The sender checked the slice against our block size; a message that breaks it is refused, not placed.
    if (geometry[0] <= 0 || geometry[1] < 0 || geometry[2] < 0 || !check_block_bytes(block_bytes_, block_bytes_, &slice).ok())
      return Status(StatusCode::kInternal, "a KV message from rank " + std::to_string(source) + " holds slices outside this pool's rows");
    each = static_cast<std::size_t>(slice.rows) * slice.bytes;
  }
  const std::size_t header = (sliced ? kSliceHeader : kDataHeader) + 4 * static_cast<std::size_t>(std::max(count, 0));
  if (count < 0 || size != header + static_cast<std::size_t>(count) * each)
    return Status(StatusCode::kInternal, "a KV message from rank " + std::to_string(source) + " of " +
                                             std::to_string(size) + " bytes does not hold the " +
                                             std::to_string(count) + " blocks it announces");
  std::vector<int32_t> dst(static_cast<std::size_t>(count));
  std::memcpy(dst.data(), m + (sliced ? kSliceHeader : kDataHeader), 4 * dst.size());
  for (int32_t d : dst)
    if (d < 0 || d >= n_blocks_)
      return Status(StatusCode::kInternal, "a KV message from rank " + std::to_string(source) + " names block " +
                                               std::to_string(d) + ", outside this pool");
  if (sliced) {
    copy_slices(dst, slice, const_cast<uint8_t*>(m) + header, true);
    return Status();
  }
  for (std::size_t i = 0; i < dst.size();) {
    std::size_t n = 1;
    while (i + n < dst.size() && dst[i + n] == dst[i] + static_cast<int32_t>(n)) ++n;
    copy_blocks(dst[i], static_cast<int32_t>(n), const_cast<uint8_t*>(m) + header + i * block_bytes_, true);
    i += n;
  }
  return Status();
}

Status MpiTwoSidedTransport::destroy() {
  // Finish what is in flight (every notice out) before the pool goes; what still arrives is dropped.
  std::vector<Notification> ignored;
  TANDEM_RETURN_IF_ERROR(finish_in_flight(
      comm_, [&] { return progress(ignored); },
      [&] {
        return any_pending(outgoing_) || !notices_.empty();
      }));
  return Status();
}

}  // namespace tandem::mpi
