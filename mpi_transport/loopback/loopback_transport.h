// In-process KvTransport: every endpoint lives in one process (threads, or
// a -np 1 job) and a transfer is a memcpy done in post(). The notification
// goes to the peer's inbox at the sender's next poll() or progress(), so an
// abort() before that delivers the aborted notice instead, as on the real
// backends. The reference the other backends are checked against, and what
// a single-process disaggregated test (the worker service's) uses.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "mpi_transport/kv_transport.h"

namespace tandem::mpi {

// The pools and notification inboxes of every endpoint; shared by the endpoints of one "job".
class LoopbackHub {
 public:
  explicit LoopbackHub(int size);
  int size() const { return static_cast<int>(pools_.size()); }

 private:
  friend class LoopbackTransport;
  struct Pool {
    std::unique_ptr<uint8_t[]> owned;  // allocate_pool's
    uint8_t* memory = nullptr;
    std::size_t block_bytes = 0;
    int64_t n_blocks = 0;
    std::size_t capacity = 0;  // bytes as set up (relayout() stays inside them)
    std::deque<Notification> inbox;
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
  Capabilities capabilities() const override { return {false, true, true, 1 << 16, true}; }
  Status allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) override;
  Status register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) override;
  Status relayout(int peer, std::size_t block_bytes, int64_t n_blocks) override;
  Status post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
              std::span<const uint8_t> notification, XferId& id) override {
    return copy(peer, src, dst, nullptr, notification, id);
  }
  Status post_slice(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, const RowSlice& slice,
                    std::span<const uint8_t> notification, XferId& id) override {
    return copy(peer, src, dst, &slice, notification, id);
  }
  Status poll(XferId id, XferState& state) override;
  Status abort(XferId id) override;
  void release(XferId id) override { outgoing_.erase(id); }
  Status progress(std::vector<Notification>& arrived) override;
  Status destroy() override;

 private:
  struct Outgoing {
    int peer = 0;
    std::vector<uint8_t> notification;
    bool aborted = false;
    XferState state = XferState::kPending;
  };
  Status copy(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, const RowSlice* slice,
              std::span<const uint8_t> notification, XferId& id);
  void deliver(Outgoing& o);

  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
  XferId next_id_ = 1;
  std::unordered_map<XferId, Outgoing> outgoing_;
};

}  // namespace tandem::mpi
