#include "mpi_transport/notices.h"

#include <cstring>

#include "common/backoff.h"

namespace tandem::mpi {

std::vector<uint8_t> pack_notice(int64_t id, bool aborted, std::span<const uint8_t> bytes) {
  std::vector<uint8_t> m;
  pack_notice(id, aborted, bytes, m);
  return m;
}

void pack_notice(int64_t id, bool aborted, std::span<const uint8_t> bytes, std::vector<uint8_t>& m) {
  m.resize(9 + bytes.size());
  std::memcpy(m.data(), &id, 8);
  m[8] = aborted ? 1 : 0;
  if (!bytes.empty()) std::memcpy(m.data() + 9, bytes.data(), bytes.size());
}

bool unpack_notice(int peer, const std::vector<uint8_t>& m, Notice& out) {
  if (m.size() < 9) return false;
  out.peer = peer;
  std::memcpy(&out.id, m.data(), 8);
  out.aborted = m[8] != 0;
  out.bytes.assign(m.begin() + 9, m.end());
  return true;
}

Status Notices::send(int peer, int64_t id, bool aborted, std::span<const uint8_t> bytes) {
  std::vector<uint8_t> buffer;
  if (!spare_.empty()) buffer = std::move(spare_.back()), spare_.pop_back();
  pack_notice(id, aborted, bytes, buffer);
  return send_packed(peer, buffer);
}

Status Notices::send_packed(int peer, std::vector<uint8_t>& packed) {
  sending_.emplace_back(MPI_REQUEST_NULL, std::move(packed));
  packed.clear();
  if (!spare_.empty()) packed = std::move(spare_.back()), spare_.pop_back();
  auto& [request, m] = sending_.back();
  TANDEM_MPI(MPI_Isend(m.data(), static_cast<int>(m.size()), MPI_BYTE, peer, tag_, comm_, &request));
  return Status();
}

Status Notices::poll(std::vector<Notice>& arrived) {
  TANDEM_RETURN_IF_ERROR(receive_waiting<uint8_t>(comm_, tag_, MPI_BYTE, [&](int peer, const std::vector<uint8_t>& m) {
    Notice n;
    if (!unpack_notice(peer, m, n))
      return Status(StatusCode::kInternal, "a KV notification from rank " + std::to_string(peer) + " is malformed");
    arrived.push_back(std::move(n));
    return Status();
  }));
  while (!sending_.empty()) {
    int done = 0;
    TANDEM_MPI(MPI_Test(&sending_.front().first, &done, MPI_STATUS_IGNORE));
    if (!done) break;
    if (spare_.size() < 64) spare_.push_back(std::move(sending_.front().second));
    sending_.pop_front();
  }
  return Status();
}

Status finish_in_flight(MPI_Comm comm, const std::function<Status()>& progress, const std::function<bool()>& pending) {
  Backoff wait;
  MPI_Request all_sent = MPI_REQUEST_NULL;
  for (;;) {
    TANDEM_RETURN_IF_ERROR(progress());
    if (all_sent == MPI_REQUEST_NULL) {
      if (!pending()) TANDEM_MPI(MPI_Ibarrier(comm, &all_sent));
    } else {
      int done = 0;
      TANDEM_MPI(MPI_Test(&all_sent, &done, MPI_STATUS_IGNORE));
      if (done) return Status();
    }
    wait.idle();
  }
}

}  // namespace tandem::mpi
