#include "mpi_transport/mpi_rma/mpi_rma_transport.h"

#include <algorithm>
#include <exception>

#include "mpi_transport/comm.h"
#include "mpi_transport/mpi_check.h"
#include "mpi_transport/mpi_env.h"

namespace tandem::mpi {
namespace {
constexpr int kTagNotice = 1;
}  // namespace

MpiRmaTransport::MpiRmaTransport(MPI_Comm comm) : comm_(comm) {
  TANDEM_MPI_OR_THROW(MPI_Comm_rank(comm_, &rank_));
  TANDEM_MPI_OR_THROW(MPI_Comm_size(comm_, &size_));
  TANDEM_MPI_OR_THROW(MPI_Comm_dup(comm_, &notify_comm_));
  TANDEM_MPI_OR_THROW(MPI_Comm_set_errhandler(notify_comm_, MPI_ERRORS_RETURN));
  notices_ = std::make_unique<Notices>(notify_comm_, kTagNotice);
  // Which ranks share our node (and so our memory).
  const Comm node = split_node(comm_, rank_);
  int n_here = 0;
  TANDEM_MPI_OR_THROW(MPI_Comm_size(node.get(), &n_here));
  std::vector<int> here(static_cast<std::size_t>(n_here));
  TANDEM_MPI_OR_THROW(MPI_Allgather(&rank_, 1, MPI_INT, here.data(), 1, MPI_INT, node.get()));
  on_node_.assign(static_cast<std::size_t>(size_), 0);
  for (int r : here) on_node_[static_cast<std::size_t>(r)] = 1;
}

// Collective teardown only on the normal path: while an exception unwinds the
// job is ending with MPI_Abort, and a collective could wait for ever.
MpiRmaTransport::~MpiRmaTransport() {
  if (std::uncaught_exceptions() > 0) return;
  if (win_ != MPI_WIN_NULL) (void)destroy();
  if (notify_comm_ != MPI_COMM_NULL) MPI_Comm_free(&notify_comm_);
}

Status MpiRmaTransport::allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) {
  TANDEM_RETURN_IF_ERROR(open_window(true, nullptr, block_bytes, n_blocks));
  *base = base_;
  return Status();
}

Status MpiRmaTransport::register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) {
  return open_window(false, base, block_bytes, n_blocks);
}

Status MpiRmaTransport::open_window(bool allocate, void* base, std::size_t block_bytes, int64_t n_blocks) {
  if (win_ != MPI_WIN_NULL) return Status(StatusCode::kInvalidArgument, "the pool is already set up");
  block_bytes_ = block_bytes;
  n_blocks_ = n_blocks;
  const auto bytes = static_cast<MPI_Aint>(block_bytes * static_cast<std::size_t>(n_blocks));
  if (allocate) {
    TANDEM_MPI(MPI_Win_allocate(bytes, 1, MPI_INFO_NULL, comm_, &base_, &win_));
  } else {
    base_ = static_cast<uint8_t*>(base);
    TANDEM_MPI(MPI_Win_create(base, bytes, 1, MPI_INFO_NULL, comm_, &win_));
  }
  TANDEM_MPI(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN));
  peer_blocks_.resize(static_cast<std::size_t>(size_));
  TANDEM_MPI(MPI_Allgather(&n_blocks_, 1, MPI_INT64_T, peer_blocks_.data(), 1, MPI_INT64_T, comm_));
  peer_block_bytes_.resize(static_cast<std::size_t>(size_));
  const uint64_t mine = block_bytes_;
  TANDEM_MPI(MPI_Allgather(&mine, 1, MPI_UINT64_T, peer_block_bytes_.data(), 1, MPI_UINT64_T, comm_));
  peer_capacity_ = capacities(peer_blocks_, peer_block_bytes_);
  TANDEM_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
  return Status();
}

Status MpiRmaTransport::relayout(int peer, std::size_t block_bytes, int64_t n_blocks) {
  TANDEM_RETURN_IF_ERROR(relayout_peer(peer, block_bytes, n_blocks, peer_capacity_, peer_blocks_, peer_block_bytes_));
  if (peer == rank_) block_bytes_ = block_bytes, n_blocks_ = n_blocks;
  return Status();
}

Status MpiRmaTransport::put(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                            const RowSlice* slice, std::span<const uint8_t> notification, XferId& id) {
  if (win_ == MPI_WIN_NULL) return Status(StatusCode::kUnavailable, "pool not created");
  const bool known = peer >= 0 && peer < size_;
  TANDEM_RETURN_IF_ERROR(check_post(peer, size_, src, dst, n_blocks_, known ? peer_blocks_[static_cast<std::size_t>(peer)] : 0,
                                    notification.size(), capabilities().max_notification_bytes));
  if (slice || peer_block_bytes_[static_cast<std::size_t>(peer)] != block_bytes_)  // else whole blocks of one size
    TANDEM_RETURN_IF_ERROR(check_block_bytes(block_bytes_, peer_block_bytes_[static_cast<std::size_t>(peer)], slice));
  id = next_id_++;
  Outgoing& o = outgoing_.add(id);
  o.peer = peer;
  pack_notice(id, false, notification, o.notice);
  coalesce(src, dst, runs_);
  for (const auto& r : runs_) {
    if (Status st = put_run(o, r, slice); !st.ok()) {
      o.aborted = true;  // what was put lands; the peer hears of this transfer as aborted once it has
      return st;
    }
  }
  return Status();  // it advances in poll() and progress(): an abort() until then still tells the peer
}

// A peer on this node: MPI_Put copies inside the call (shared memory), so no
// request is needed and the flush in advance() returns at once. Elsewhere:
// MPI_Rput, whose request advance() tests without blocking. This and
// put_run() are inlined into put(): the calls cost ~1% of a 64 KiB transfer
// (kv_transfer_bench).
[[gnu::always_inline]] inline Status MpiRmaTransport::issue(Outgoing& o, const uint8_t* from, int count, MPI_Datatype from_type, MPI_Aint at,
                              MPI_Datatype to_type) {
  o.flush = true;
  if (on_node_[static_cast<std::size_t>(o.peer)]) {
    TANDEM_MPI(MPI_Put(from, count, from_type, o.peer, at, count, to_type, win_));
    return Status();
  }
  MPI_Request req = MPI_REQUEST_NULL;
  TANDEM_MPI(MPI_Rput(from, count, from_type, o.peer, at, count, to_type, win_, &req));
  o.puts.push_back(req);
  return Status();
}

[[gnu::always_inline]] inline Status MpiRmaTransport::put_run(Outgoing& o, const BlockRun& r, const RowSlice* slice) {
  const std::size_t theirs = peer_block_bytes_[static_cast<std::size_t>(o.peer)];
  if (!slice) {
    // MPI counts are ints: split very long runs.
    const std::size_t total = static_cast<std::size_t>(r.count) * block_bytes_;
    const std::size_t chunk = std::size_t{1} << 30;
    for (std::size_t off = 0; off < total; off += chunk) {
      const int n = static_cast<int>(std::min(chunk, total - off));
      TANDEM_RETURN_IF_ERROR(issue(o, base_ + static_cast<std::size_t>(r.src) * block_bytes_ + off, n, MPI_BYTE,
                                   static_cast<MPI_Aint>(static_cast<std::size_t>(r.dst) * theirs + off), MPI_BYTE));
    }
    return Status();
  }
  // The run's rows follow one another on both sides (a block is whole rows): one strided type a side.
  const auto rows = static_cast<int64_t>(r.count) * slice->rows;
  const std::size_t ours_row = block_bytes_ / static_cast<std::size_t>(slice->rows);
  const std::size_t theirs_row = theirs / static_cast<std::size_t>(slice->rows);
  const int64_t per_put = std::max<int64_t>(1, (int64_t{1} << 30) / static_cast<int64_t>(std::max<std::size_t>(slice->bytes, 1)));
  for (int64_t first = 0; first < rows; first += per_put) {
    const int n = static_cast<int>(std::min(per_put, rows - first));
    struct Types {  // freed on every path; the put keeps what it needs
      MPI_Datatype from = MPI_DATATYPE_NULL, to = MPI_DATATYPE_NULL;
      ~Types() {
        if (from != MPI_DATATYPE_NULL) MPI_Type_free(&from);
        if (to != MPI_DATATYPE_NULL) MPI_Type_free(&to);
      }
    } t;
    TANDEM_MPI(MPI_Type_create_hvector(n, static_cast<int>(slice->bytes), static_cast<MPI_Aint>(ours_row), MPI_BYTE, &t.from));
    TANDEM_MPI(MPI_Type_create_hvector(n, static_cast<int>(slice->bytes), static_cast<MPI_Aint>(theirs_row), MPI_BYTE, &t.to));
    TANDEM_MPI(MPI_Type_commit(&t.from));
    TANDEM_MPI(MPI_Type_commit(&t.to));
    TANDEM_RETURN_IF_ERROR(issue(o,
                                 base_ + static_cast<std::size_t>(r.src) * block_bytes_ +
                                     static_cast<std::size_t>(first) * ours_row + slice->src_offset,
                                 1, t.from,
                                 static_cast<MPI_Aint>(static_cast<std::size_t>(r.dst) * theirs +
                                                       static_cast<std::size_t>(first) * theirs_row + slice->dst_offset),
                                 t.to));
  }
  return Status();
}

// Once every put is complete here, completes them at the target and sends
// the notification (or the notice that the transfer was given up).
Status MpiRmaTransport::advance(Outgoing& o) {
  if (o.state != XferState::kPending) return Status();
  if (!o.puts.empty()) {
    int done = 0;
    TANDEM_MPI(MPI_Testall(static_cast<int>(o.puts.size()), o.puts.data(), &done, MPI_STATUSES_IGNORE));
    if (!done) return Status();
    o.puts.clear();
  }
  if (o.flush) {
    TANDEM_MPI(MPI_Win_flush(o.peer, win_));
    o.flush = false;
  }
  o.notice[8] = o.aborted ? 1 : 0;  // pack_notice's aborted byte
  TANDEM_RETURN_IF_ERROR(notices_->send_packed(o.peer, o.notice));
  o.state = o.aborted ? XferState::kAborted : XferState::kDone;
  return Status();
}

Status MpiRmaTransport::poll(XferId id, XferState& state) {
  return poll_outgoing(outgoing_, id, state, [this](XferId, Outgoing& o) { return advance(o); });
}

Status MpiRmaTransport::abort(XferId id) {
  return abort_outgoing(outgoing_, id, [this](XferId, Outgoing& o) { return advance(o); });
}

Status MpiRmaTransport::progress(std::vector<Notification>& arrived) {
  for (auto& [id, o] : outgoing_) TANDEM_RETURN_IF_ERROR(advance(o));
  std::vector<Notice> notices;
  TANDEM_RETURN_IF_ERROR(notices_->poll(notices));
  for (auto& n : notices) arrived.push_back({n.peer, n.aborted, std::move(n.bytes)});
  return Status();
}

Status MpiRmaTransport::destroy() {
  if (win_ == MPI_WIN_NULL) return Status();
  // Every transfer's notice out before the window goes (the peers may still be waiting for one).
  std::vector<Notification> ignored;
  TANDEM_RETURN_IF_ERROR(finish_in_flight(
      comm_, [&] { return progress(ignored); },
      [&] {
        return any_pending(outgoing_) || notices_->sending();
      }));
  TANDEM_MPI(MPI_Win_unlock_all(win_));
  TANDEM_MPI(MPI_Win_free(&win_));
  win_ = MPI_WIN_NULL;
  return Status();
}

}  // namespace tandem::mpi
