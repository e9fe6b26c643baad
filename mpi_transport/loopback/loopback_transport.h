// In-process KvTransport: every endpoint lives in one process (threads, or
// a -np 1 job) and a transfer is a memcpy. The reference the other backends
// are checked against, and what a single-process disaggregated test uses.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "mpi_transport/kv_transport.h"

namespace tandem::mpi {

// The pools of every endpoint; shared by the endpoints of one "job".
class LoopbackHub {
 public:
  explicit LoopbackHub(int size);
  int size() const { return static_cast<int>(pools_.size()); }

 private:
  friend class LoopbackTransport;
  struct Pool {
    std::unique_ptr<uint8_t[]> memory;
    std::size_t block_bytes = 0;
    int64_t n_blocks = 0;
  };
  std::mutex mutex_;
  std::vector<Pool> pools_;
};

class LoopbackTransport : public KvTransport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  std::string_view name() const override { return "loopback"; }
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  Status create_pool(std::size_t block_bytes, int64_t n_blocks, void** base) override;
  Status post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, Transfer& transfer) override;
  Status test(Transfer& transfer) override;
  Status destroy() override { return Status(); }

 private:
  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
};

}  // namespace tandem::mpi
