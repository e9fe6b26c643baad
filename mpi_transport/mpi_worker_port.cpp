#include "mpi_transport/mpi_worker_port.h"

#include "common/error.h"
#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {
namespace {

void check(const Status& s) {
  if (!s.ok()) throw Error(s.to_string());
}

}  // namespace

MpiWorkerPort::MpiWorkerPort(Mailbox& box, KvTransport* transport) : box_(box), transport_(transport) {
  TANDEM_MPI_OR_THROW(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
}

bool MpiWorkerPort::receive(Message& out) {
  check(box_.progress());  // sends completed so far retire
  std::optional<mpi::Message> m;
  check(box_.try_recv(m));
  if (!m) return false;
  out.source = m->source;
  out.type = static_cast<service::MsgType>(m->tag);
  out.bytes = std::move(m->bytes);
  return true;
}

void MpiWorkerPort::send(int dest, service::MsgType type, std::vector<uint8_t> bytes) {
  check(box_.send(dest, service::tag_of(type), std::move(bytes)));
}

int64_t MpiWorkerPort::post_kv(int dest, std::span<const int32_t> src, std::span<const int32_t> dst,
                               std::span<const uint8_t> note, const KvSlice* slice) {
  XferId id = 0;
  if (!slice) {
    check(transport_->post(dest - 1, src, dst, note, id));
    return id;
  }
  const RowSlice rows{slice->rows, slice->src_offset, slice->dst_offset, slice->bytes};
  check(transport_->post_slice(dest - 1, src, dst, rows, note, id));
  return id;
}

service::WorkerPort::KvState MpiWorkerPort::poll_kv(int64_t id) {
  XferState st = XferState::kPending;
  check(transport_->poll(id, st));
  return st == XferState::kDone ? KvState::kDone : st == XferState::kAborted ? KvState::kAborted : KvState::kPending;
}

void MpiWorkerPort::release_kv(int64_t id) { transport_->release(id); }

void MpiWorkerPort::pump() {
  if (transport_) check(transport_->progress(arrived_));
}

void MpiWorkerPort::kv_arrivals(std::vector<KvArrival>& out) {
  check(transport_->progress(arrived_));
  for (auto& n : arrived_) out.push_back({n.peer + 1, n.aborted, std::move(n.bytes)});
  arrived_.clear();
}

void MpiWorkerPort::relayout_kv(int peer, std::size_t block_bytes, int64_t n_blocks) {
  if (transport_) check(transport_->relayout(peer - 1, block_bytes, n_blocks));
}

void MpiWorkerPort::flush() { check(box_.flush()); }

}  // namespace tandem::mpi
