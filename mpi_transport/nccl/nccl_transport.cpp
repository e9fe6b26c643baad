#include "mpi_transport/nccl/nccl_transport.h"

#include <string>

#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {
namespace {

constexpr int kTagHeader = 1;
constexpr int kTagAck = 2;

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
  MPI_Comm_dup(comm, &comm_);  // a private channel for headers and acknowledgements
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  acks_ = std::make_unique<Acks>(comm_, kTagAck);
}

NcclTransport::~NcclTransport() {
  for (auto& in : incoming_)
    if (in.done) cudaEventDestroy(in.done);
  for (int d = 0; d < 2; ++d) {
    if (nccl_[d]) ncclCommDestroy(nccl_[d]);
    if (stream_[d]) cudaStreamDestroy(stream_[d]);
  }
  if (pool_) cudaFree(pool_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Status NcclTransport::create_pool(std::size_t block_bytes, int64_t n_blocks, void** base) {
  block_bytes_ = block_bytes;
  n_blocks_ = n_blocks;
  // Every rank learns whether every pool was made before any waits on the
  // others: a rank that returned alone would leave the rest in MPI_Allgather.
  cudaError_t made = cudaMalloc(reinterpret_cast<void**>(&pool_), block_bytes * static_cast<std::size_t>(n_blocks));
  if (made == cudaSuccess) made = cudaMemset(pool_, 0, block_bytes * static_cast<std::size_t>(n_blocks));
  if (made == cudaSuccess) made = cudaDeviceSynchronize();
  int all_made = made == cudaSuccess;
  TANDEM_MPI(MPI_Allreduce(MPI_IN_PLACE, &all_made, 1, MPI_INT, MPI_MIN, comm_));
  if (made != cudaSuccess) return cuda_status(made, "cudaMalloc (the KV pool)", __FILE__, __LINE__);
  if (!all_made) return Status(StatusCode::kUnavailable, "another rank could not allocate its KV pool on its GPU");
  peer_blocks_.resize(static_cast<std::size_t>(size_));
  TANDEM_MPI(MPI_Allgather(&n_blocks_, 1, MPI_INT64_T, peer_blocks_.data(), 1, MPI_INT64_T, comm_));
  for (int d = 0; d < 2; ++d) {
    TANDEM_CUDA_RT(cudaStreamCreateWithFlags(&stream_[d], cudaStreamNonBlocking));
    ncclUniqueId id{};
    if (rank_ == 0) TANDEM_NCCL(ncclGetUniqueId(&id));
    TANDEM_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm_));
    TANDEM_NCCL(ncclCommInitRank(&nccl_[d], size_, id, rank_));
  }
  TANDEM_RETURN_IF_ERROR(connect_all());
  *base = pool_;
  return Status();
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

Status NcclTransport::post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, Transfer& transfer) {
  if (!pool_) return Status(StatusCode::kUnavailable, "pool not created");
  if (peer == rank_) return Status(StatusCode::kInvalidArgument, "NCCL does not send to its own rank");
  TANDEM_RETURN_IF_ERROR(
      check_post(peer, size_, src, dst, n_blocks_, peer >= 0 && peer < size_ ? peer_blocks_[static_cast<std::size_t>(peer)] : 0));
  transfer = Transfer{peer, src.size() * block_bytes_, src.empty(), 0};
  if (src.empty()) return Status();
  const int64_t id = next_id_++;
  const auto runs = coalesce(src, dst);
  Outgoing& o = outgoing_[id];
  o.header = {id, static_cast<int64_t>(runs.size())};
  for (const BlockRun& r : runs) o.header.insert(o.header.end(), {r.dst, r.count});
  // The header first: the peer must post its receives for our sends to complete.
  TANDEM_MPI(MPI_Isend(o.header.data(), static_cast<int>(o.header.size()), MPI_INT64_T, peer, kTagHeader, comm_,
                       &o.request));
  TANDEM_RETURN_IF_ERROR(issue(peer, runs, true));
  transfer.backend_handle = id;
  return Status();
}

Status NcclTransport::test(Transfer& transfer) {
  if (transfer.done) return Status();
  TANDEM_RETURN_IF_ERROR(progress());
  auto it = outgoing_.find(transfer.backend_handle);
  if (it == outgoing_.end()) return Status(StatusCode::kNotFound, "unknown transfer");
  int sent = 0;
  TANDEM_MPI(MPI_Test(&it->second.request, &sent, MPI_STATUS_IGNORE));
  if (sent && it->second.acked) {
    transfer.done = true;
    outgoing_.erase(it);
  }
  return Status();
}

Status NcclTransport::progress() {
  // Acknowledgements of our transfers (and of our acknowledgements, sent).
  TANDEM_RETURN_IF_ERROR(acks_->poll([&](int64_t id) {
    if (auto it = outgoing_.find(id); it != outgoing_.end()) it->second.acked = true;
  }));
  // Transfers to us: receive into the destination runs.
  const Status received = receive_waiting<int64_t>(comm_, kTagHeader, MPI_INT64_T, [&](int peer, const std::vector<int64_t>& h) {
    const auto count = static_cast<int64_t>(h.size());
    if (count < 2 || count != 2 + 2 * h[1]) return Status(StatusCode::kInternal, "malformed NCCL transfer header");
    std::vector<BlockRun> runs;
    for (int64_t i = 0; i < h[1]; ++i)
      runs.push_back({0, static_cast<int32_t>(h[static_cast<std::size_t>(2 + 2 * i)]),
                      static_cast<int32_t>(h[static_cast<std::size_t>(3 + 2 * i)])});
    TANDEM_RETURN_IF_ERROR(issue(peer, runs, false));
    Incoming in{peer, h[0], nullptr};
    TANDEM_CUDA_RT(cudaEventCreateWithFlags(&in.done, cudaEventDisableTiming));
    TANDEM_CUDA_RT(cudaEventRecord(in.done, stream_[direction(peer, false)]));
    incoming_.push_back(in);
    return Status();
  });
  if (!received.ok()) return received;
  // Receives that have landed: acknowledge, in order.
  while (!incoming_.empty()) {
    const cudaError_t q = cudaEventQuery(incoming_.front().done);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: never left for the model's next launch check to find
      break;
    }
    if (q != cudaSuccess) return cuda_status(q, "cudaEventQuery", __FILE__, __LINE__);
    Incoming in = incoming_.front();
    incoming_.pop_front();
    cudaEventDestroy(in.done);
    TANDEM_RETURN_IF_ERROR(acks_->send(in.peer, in.id));
  }
  return Status();
}

Status NcclTransport::destroy() {
  for (int i = 0; i < 1000000 && (acks_->sending() || !outgoing_.empty() || !incoming_.empty()); ++i) {
    TANDEM_RETURN_IF_ERROR(progress());
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {  // a header's send completes before it is freed
      int sent = 0;
      TANDEM_MPI(MPI_Test(&it->second.request, &sent, MPI_STATUS_IGNORE));
      it = sent && it->second.acked ? outgoing_.erase(it) : std::next(it);
    }
  }
  TANDEM_MPI(MPI_Barrier(comm_));
  return Status();
}

}  // namespace tandem::mpi
