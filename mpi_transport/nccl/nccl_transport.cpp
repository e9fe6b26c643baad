#include "mpi_transport/nccl/nccl_transport.h"

#include <algorithm>
#include <exception>
#include <cstring>
#include <string>

#include "mpi_transport/mpi_check.h"
#include "mpi_transport/mpi_env.h"
#include "mpi_transport/notices.h"

namespace tandem::mpi {
namespace {

constexpr int kTag = 1;
constexpr uint8_t kHeader = 0, kNotice = 1;

Status nccl_status(ncclResult_t r, const char* call, const char* file, int line) {
  return Status(StatusCode::kInternal, std::string(call) + ": " + ncclGetErrorString(r))
      .at(file, line);
}
Status cuda_status(cudaError_t e, const char* call, const char* file, int line) {
  return Status(StatusCode::kInternal, std::string(call) + ": " + cudaGetErrorString(e)).at(file, line);
}

}  // namespace

#define TANDEM_NCCL(call)                                                             \
  do {                                                                                \
    const ncclResult_t tandem_r_ = (call);                                            \
    if (tandem_r_ != ncclSuccess) return nccl_status(tandem_r_, #call, __FILE__, __LINE__); \
  } while (0)
#define TANDEM_CUDA_RT(call)                                                          \
  do {                                                                                \
    const cudaError_t tandem_e_ = (call);                                             \
    if (tandem_e_ != cudaSuccess) return cuda_status(tandem_e_, #call, __FILE__, __LINE__); \
  } while (0)

NcclTransport::NcclTransport(MPI_Comm comm) {
  MPI_Comm_dup(comm, &comm_);  // a private channel for headers and notices
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

NcclTransport::~NcclTransport() {
  for (auto& in : incoming_)
    if (in.done) cudaEventDestroy(in.done);
  for (auto& [id, o] : outgoing_)
    if (o.sent) cudaEventDestroy(o.sent);
  for (int d = 0; d < 2; ++d) {
    if (nccl_[d]) ncclCommDestroy(nccl_[d]);
    if (stream_[d]) cudaStreamDestroy(stream_[d]);
  }
  if (pool_ && owns_pool_) cudaFree(pool_);
  if (comm_ != MPI_COMM_NULL && std::uncaught_exceptions() == 0) MPI_Comm_free(&comm_);  // not while the job aborts
}

Status NcclTransport::allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) {
  // Every rank learns whether every pool was made before any waits on the
  // others: a rank that returned alone would leave the rest in MPI_Allgather.
  cudaError_t made = cudaMalloc(reinterpret_cast<void**>(&pool_), block_bytes * static_cast<std::size_t>(n_blocks));
  if (made == cudaSuccess) made = cudaMemset(pool_, 0, block_bytes * static_cast<std::size_t>(n_blocks));
  if (made == cudaSuccess) made = cudaDeviceSynchronize();
  owns_pool_ = made == cudaSuccess;
  int all_made = made == cudaSuccess;
  TANDEM_MPI(MPI_Allreduce(MPI_IN_PLACE, &all_made, 1, MPI_INT, MPI_MIN, comm_));
  if (made != cudaSuccess) return cuda_status(made, "cudaMalloc (the KV pool)", __FILE__, __LINE__);
  if (!all_made) return Status(StatusCode::kUnavailable, "another rank could not allocate its KV pool on its GPU");
  TANDEM_RETURN_IF_ERROR(setup(block_bytes, n_blocks));
  *base = pool_;
  return Status();
}

Status NcclTransport::register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) {
  pool_ = static_cast<uint8_t*>(base);
  owns_pool_ = false;
  return setup(block_bytes, n_blocks);
}

Status NcclTransport::setup(std::size_t block_bytes, int64_t n_blocks) {
  block_bytes_ = block_bytes;
  n_blocks_ = n_blocks;
  peer_blocks_.resize(static_cast<std::size_t>(size_));
  TANDEM_MPI(MPI_Allgather(&n_blocks_, 1, MPI_INT64_T, peer_blocks_.data(), 1, MPI_INT64_T, comm_));
  for (int d = 0; d < 2; ++d) {
    TANDEM_CUDA_RT(cudaStreamCreateWithFlags(&stream_[d], cudaStreamNonBlocking));
    ncclUniqueId id{};
    if (rank_ == 0) TANDEM_NCCL(ncclGetUniqueId(&id));
    TANDEM_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm_));
    TANDEM_NCCL(ncclCommInitRank(&nccl_[d], size_, id, rank_));
  }
  return connect_all();
}

// NCCL connects a pair on its first send or receive, inside ncclGroupEnd,
// and holds the host there until the peer joins. Left to the first transfer,
// two ranks sending to each other at once (one on each communicator) would
// each wait for the other for ever, and any sender would stall until its
// peer's next progress(). So every pair is connected here, all ranks
// together: in one group per communicator, one byte each way that it carries.
Status NcclTransport::connect_all() {
  uint8_t* scratch = nullptr;  // [0]: the byte sent; [1 + p]: the byte from rank p
  TANDEM_CUDA_RT(cudaMalloc(reinterpret_cast<void**>(&scratch), static_cast<std::size_t>(size_) + 1));
  Status s;
  for (int d = 0; d < 2 && s.ok(); ++d) {
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
      if (p == rank_) continue;
      r = direction(p, true) == d ? ncclSend(scratch, 1, ncclUint8, p, nccl_[d], stream_[d])
                                  : ncclRecv(scratch + 1 + p, 1, ncclUint8, p, nccl_[d], stream_[d]);
    }
    const ncclResult_t ended = ncclGroupEnd();
    if (r == ncclSuccess) r = ended;
    if (r != ncclSuccess) s = nccl_status(r, "connecting the NCCL pairs", __FILE__, __LINE__);
    else if (const cudaError_t e = cudaStreamSynchronize(stream_[d]); e != cudaSuccess)
      s = cuda_status(e, "cudaStreamSynchronize (connecting the NCCL pairs)", __FILE__, __LINE__);
  }
  cudaFree(scratch);
  return s;
}

// Traffic from a lower rank to a higher one uses communicator and stream 0,
// the other way 1: a pair's sends in one direction never queue behind its
// receives in the other, which could wait on each other.
int NcclTransport::direction(int peer, bool send) const { return (send ? rank_ < peer : peer < rank_) ? 0 : 1; }

// One NCCL group: a send (or receive) per run, in run order, on its direction's stream.
Status NcclTransport::issue(int peer, const std::vector<BlockRun>& runs, bool send) {
  const int d = direction(peer, send);
  TANDEM_NCCL(ncclGroupStart());
  for (const BlockRun& r : runs) {
    const std::size_t bytes = static_cast<std::size_t>(r.count) * block_bytes_;
    uint8_t* at = pool_ + static_cast<std::size_t>(send ? r.src : r.dst) * block_bytes_;
    const ncclResult_t res = send ? ncclSend(at, bytes, ncclUint8, peer, nccl_[d], stream_[d])
                                  : ncclRecv(at, bytes, ncclUint8, peer, nccl_[d], stream_[d]);
    if (res != ncclSuccess) {
      ncclGroupEnd();
      return nccl_status(res, send ? "ncclSend" : "ncclRecv", __FILE__, __LINE__);
    }
  }
  TANDEM_NCCL(ncclGroupEnd());
  return Status();
}

Status NcclTransport::send(Outgoing& o, std::vector<uint8_t> bytes) {
  o.sends.emplace_back(MPI_REQUEST_NULL, std::move(bytes));
  auto& [request, m] = o.sends.back();
  TANDEM_MPI(MPI_Isend(m.data(), static_cast<int>(m.size()), MPI_BYTE, o.peer, kTag, comm_, &request));
  return Status();
}

Status NcclTransport::post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                           std::span<const uint8_t> notification, XferId& id) {
  if (!pool_) return Status(StatusCode::kUnavailable, "pool not created");
  if (peer == rank_) return Status(StatusCode::kInvalidArgument, "NCCL does not send to its own rank");
  TANDEM_RETURN_IF_ERROR(check_post(peer, size_, src, dst, n_blocks_,
                                    peer >= 0 && peer < size_ ? peer_blocks_[static_cast<std::size_t>(peer)] : 0,
                                    notification.size(), capabilities().max_notification_bytes));
  id = next_id_++;
  Outgoing& o = outgoing_[id];
  o.peer = peer;
  o.notification.assign(notification.begin(), notification.end());
  if (!src.empty()) {
    const auto runs = coalesce(src, dst);
    std::vector<int64_t> h = {id, static_cast<int64_t>(runs.size())};
    for (const BlockRun& r : runs) h.insert(h.end(), {r.dst, r.count});
    std::vector<uint8_t> header(1 + 8 * h.size());
    header[0] = kHeader;
    std::memcpy(header.data() + 1, h.data(), 8 * h.size());
    // The header first: the peer must post its receives for our sends to complete.
    TANDEM_RETURN_IF_ERROR(send(o, std::move(header)));
    TANDEM_RETURN_IF_ERROR(issue(peer, runs, true));
    TANDEM_CUDA_RT(cudaEventCreateWithFlags(&o.sent, cudaEventDisableTiming));
    TANDEM_CUDA_RT(cudaEventRecord(o.sent, stream_[direction(peer, true)]));
  }
  return Status();  // it advances in poll() and progress(): an abort() until then still tells the peer
}

// Once the NCCL sends are done, the notice follows the header (an abort only
// changes what it says: sends already issued cannot be recalled).
Status NcclTransport::advance(XferId id, Outgoing& o) {
  while (!o.sends.empty()) {  // the header's (and later the notice's) send buffers
    int done = 0;
    TANDEM_MPI(MPI_Test(&o.sends.front().first, &done, MPI_STATUS_IGNORE));
    if (!done) break;
    o.sends.pop_front();
  }
  if (o.state != XferState::kPending) return Status();
  if (o.sent) {
    const cudaError_t q = cudaEventQuery(o.sent);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: never left for the model's next launch check to find
      return Status();
    }
    if (q != cudaSuccess) return cuda_status(q, "cudaEventQuery", __FILE__, __LINE__);
    cudaEventDestroy(o.sent);
    o.sent = nullptr;
  }
  std::vector<uint8_t> notice = pack_notice(id, o.aborted, o.notification);
  notice.insert(notice.begin(), kNotice);
  TANDEM_RETURN_IF_ERROR(send(o, std::move(notice)));
  o.notification.clear();
  o.state = o.aborted ? XferState::kAborted : XferState::kDone;
  return Status();
}

Status NcclTransport::poll(XferId id, XferState& state) {
  return poll_outgoing(outgoing_, id, state, [this](XferId i, Outgoing& o) { return advance(i, o); });
}

Status NcclTransport::abort(XferId id) {
  return abort_outgoing(outgoing_, id, [this](XferId i, Outgoing& o) { return advance(i, o); });
}

void NcclTransport::release(XferId id) {
  auto it = outgoing_.find(id);
  if (it == outgoing_.end()) return;
  for (auto& s : it->second.sends) retired_.push_back(std::move(s));  // MPI still reads them
  outgoing_.erase(it);
}

Status NcclTransport::progress(std::vector<Notification>& arrived) {
  for (auto& [id, o] : outgoing_) TANDEM_RETURN_IF_ERROR(advance(id, o));
  while (!retired_.empty()) {
    int done = 0;
    TANDEM_MPI(MPI_Test(&retired_.front().first, &done, MPI_STATUS_IGNORE));
    if (!done) break;
    retired_.pop_front();
  }
  return receive(arrived);
}

// Headers post their receives; notices wait for their receives to land.
Status NcclTransport::receive(std::vector<Notification>& arrived) {
  const Status received = receive_waiting<uint8_t>(comm_, kTag, MPI_BYTE, [&](int peer, const std::vector<uint8_t>& m) {
    if (!m.empty() && m[0] == kNotice) {
      Notice n;
      if (!unpack_notice(peer, std::vector<uint8_t>(m.begin() + 1, m.end()), n))
        return Status(StatusCode::kInternal, "a KV notification from rank " + std::to_string(peer) + " is malformed");
      Notification note{peer, n.aborted, std::move(n.bytes)};
      auto in = std::find_if(incoming_.begin(), incoming_.end(),
                             [&](const Incoming& x) { return x.peer == peer && x.id == n.id; });
      if (in == incoming_.end()) arrived.push_back(std::move(note));  // a transfer without blocks
      else in->notice = std::move(note);
      return Status();
    }
    if (m.size() < 17 || (m.size() - 1) % 8 != 0) return Status(StatusCode::kInternal, "malformed NCCL transfer header");
    std::vector<int64_t> h((m.size() - 1) / 8);
    std::memcpy(h.data(), m.data() + 1, 8 * h.size());
    if (static_cast<int64_t>(h.size()) != 2 + 2 * h[1]) return Status(StatusCode::kInternal, "malformed NCCL transfer header");
    std::vector<BlockRun> runs;
    for (int64_t i = 0; i < h[1]; ++i)
      runs.push_back({0, static_cast<int32_t>(h[static_cast<std::size_t>(2 + 2 * i)]),
                      static_cast<int32_t>(h[static_cast<std::size_t>(3 + 2 * i)])});
    TANDEM_RETURN_IF_ERROR(issue(peer, runs, false));
    Incoming in{peer, h[0], nullptr, std::nullopt};
    TANDEM_CUDA_RT(cudaEventCreateWithFlags(&in.done, cudaEventDisableTiming));
    TANDEM_CUDA_RT(cudaEventRecord(in.done, stream_[direction(peer, false)]));
    incoming_.push_back(std::move(in));
    return Status();
  });
  if (!received.ok()) return received;
  // Receives that have landed; their notices go out once both are in.
  for (auto it = incoming_.begin(); it != incoming_.end();) {
    if (it->done) {
      const cudaError_t q = cudaEventQuery(it->done);
      if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        ++it;
        continue;
      }
      if (q != cudaSuccess) return cuda_status(q, "cudaEventQuery", __FILE__, __LINE__);
      cudaEventDestroy(it->done);
      it->done = nullptr;
    }
    if (!it->notice) {
      ++it;
      continue;
    }
    arrived.push_back(std::move(*it->notice));
    it = incoming_.erase(it);
  }
  return Status();
}

Status NcclTransport::destroy() {
  std::vector<Notification> ignored;
  return finish_in_flight(
      comm_, [&] { return progress(ignored); },
      [&] {
        return std::any_of(outgoing_.begin(), outgoing_.end(),
                           [](const auto& e) { return e.second.state == XferState::kPending || !e.second.sends.empty(); }) ||
               !retired_.empty() || !incoming_.empty();
      });
}

}  // namespace tandem::mpi
