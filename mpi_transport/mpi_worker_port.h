// The worker service's port under MPI: the protocol's messages in the rank's
// Mailbox (tag = MsgType) and KV transfers through the job's KvTransport (its
// ranks are the workers': world rank - 1). Errors throw tandem::Error.
#pragma once

#include <vector>

#include "mpi_transport/kv_transport.h"
#include "mpi_transport/mpi_env.h"
#include "runtime/service/worker_port.h"

namespace tandem::mpi {

class MpiWorkerPort : public service::WorkerPort {
 public:
  // transport: null when the job is aggregated throughout.
  MpiWorkerPort(Mailbox& box, KvTransport* transport);
  MpiWorkerPort(const MpiWorkerPort&) = delete;
  MpiWorkerPort& operator=(const MpiWorkerPort&) = delete;

  int rank() const override { return world_rank_; }
  bool receive(Message& out) override;
  void send(int dest, service::MsgType type, std::vector<uint8_t> bytes) override;
  bool has_kv() const override { return transport_ != nullptr; }
  int64_t post_kv(int dest, std::span<const int32_t> src, std::span<const int32_t> dst,
                  std::span<const uint8_t> note, const KvSlice* slice = nullptr) override;
  KvState poll_kv(int64_t id) override;
  void release_kv(int64_t id) override;
  void kv_arrivals(std::vector<KvArrival>& out) override;
  void relayout_kv(int peer, std::size_t block_bytes, int64_t n_blocks) override;
  void flush() override;
  // Moves KV transfers on (ours and those to us) between the service's calls;
  // what lands waits for kv_arrivals().
  void pump();

 private:
  Mailbox& box_;
  KvTransport* transport_;
  int world_rank_ = 0;
  std::vector<Notification> arrived_;  // landed, not yet handed over
};

}  // namespace tandem::mpi
