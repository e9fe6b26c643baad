#include "mpi_transport/libfabric/libfabric_transport.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "common/big_alloc.h"
#include "mpi_transport/libfabric/fabric_api.h"
#include "mpi_transport/mpi_check.h"
#include "mpi_transport/notices.h"

namespace tandem::mpi {

struct LibfabricTransport::Op {
  fi_context2 ctx{};  // first: the provider may use it (FI_CONTEXT2)
  enum class Kind { kWrite, kSend, kRecv } kind = Kind::kWrite;
  XferId id = 0;
  int slot = 0;
};

namespace {

constexpr uint32_t kFiVersion = FI_VERSION(1, 9);

Status fi_error(int rc, const char* call) {
  return Status(StatusCode::kInternal, std::string("libfabric ") + call + ": " + fabric::api()->strerror(-rc));
}

#define TANDEM_FI(call)                                          \
  do {                                                           \
    if (int tandem_fi_rc_ = static_cast<int>(call); tandem_fi_rc_ != 0) \
      return fi_error(tandem_fi_rc_, #call);                     \
  } while (0)

// What the transport needs of a provider: reliable datagram endpoints with
// writes into registered memory and messages, and completions that mean the
// data is at the target. The memory-registration modes it can follow.
fi_info* hints_for(const std::string& provider) {
  fi_info* h = fabric::api()->dupinfo(nullptr);  // fi_allocinfo()
  if (!h) return nullptr;
  h->caps = FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
  h->ep_attr->type = FI_EP_RDM;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  h->domain_attr->threading = FI_THREAD_DOMAIN;
  h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  if (!provider.empty()) h->fabric_attr->prov_name = strdup(provider.c_str());
  return h;
}

// Providers offering it, in libfabric's order of preference, each once.
std::vector<std::string> providers(const std::string& wanted) {
  std::vector<std::string> out;
  if (!fabric::api()) return out;
  fi_info* h = hints_for(wanted);
  fi_info* info = nullptr;
  if (h && fabric::api()->getinfo(kFiVersion, nullptr, nullptr, 0, h, &info) == 0) {
    for (fi_info* i = info; i; i = i->next)
      if (std::find(out.begin(), out.end(), i->fabric_attr->prov_name) == out.end()) out.emplace_back(i->fabric_attr->prov_name);
  }
  fabric::api()->freeinfo(info);
  fabric::api()->freeinfo(h);
  return out;
}

// The default: the first provider that reaches other nodes at speed (shm
// stays on one node; sockets and the udp-based rxd are slow fallbacks).
std::string default_provider() {
  for (const auto& p : providers(""))
    if (p != "shm" && p != "sockets" && p.find("ofi_rxd") == std::string::npos) return p;
  return "";
}

}  // namespace

std::string LibfabricTransport::providers_found() {
  std::string s;
  for (const auto& p : providers("")) s += (s.empty() ? "" : ", ") + p;
  return s.empty() ? "none" : s;
}

LibfabricTransport::LibfabricTransport(MPI_Comm comm, std::string provider)
    : comm_(comm), provider_wanted_(std::move(provider)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

// Collective teardown only on the normal path: while an exception unwinds the
// job is ending with MPI_Abort, and a collective could wait for ever.
LibfabricTransport::~LibfabricTransport() {
  if (std::uncaught_exceptions() == 0 && ep_) (void)destroy();
  close_fabric();
}

Status LibfabricTransport::allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) {
  if (pool_) return Status(StatusCode::kInvalidArgument, "the pool is already set up");
  pool_memory_ = allocate_big(std::max<std::size_t>(1, block_bytes * static_cast<std::size_t>(n_blocks)));
  if (!pool_memory_) return Status(StatusCode::kResourceExhausted, "cannot allocate the KV pool");
  pool_ = static_cast<uint8_t*>(pool_memory_.get());
  *base = pool_;
  return open(block_bytes, n_blocks);
}

Status LibfabricTransport::register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) {
  if (pool_) return Status(StatusCode::kInvalidArgument, "the pool is already set up");
  pool_ = static_cast<uint8_t*>(base);
  return open(block_bytes, n_blocks);
}

// Every rank opens the provider rank 0 chose, so that all agree; a rank
// that cannot still takes part in the exchanges, and every rank returns the
// first problem (no rank is left waiting in a collective).
Status LibfabricTransport::open(std::size_t block_bytes, int64_t n_blocks) {
  block_bytes_ = block_bytes;
  n_blocks_ = n_blocks;
  char chosen[256] = {};
  if (rank_ == 0) std::snprintf(chosen, sizeof chosen, "%s", (provider_wanted_.empty() ? default_provider() : provider_wanted_).c_str());
  TANDEM_MPI(MPI_Bcast(chosen, sizeof chosen, MPI_CHAR, 0, comm_));
  provider_in_use_ = chosen;
  std::string problem;
  auto setup = [&]() -> Status {
    if (!fabric::api()) return Status(StatusCode::kUnavailable, fabric::why());
    if (provider_in_use_.empty())
      return Status(StatusCode::kUnavailable, "no libfabric provider offers RDM endpoints with RMA here (found: " +
                                                  providers_found() + ")");
    fi_info* h = hints_for(provider_in_use_);
    const int rc = fabric::api()->getinfo(kFiVersion, nullptr, nullptr, 0, h, &info_);
    fabric::api()->freeinfo(h);
    if (rc != 0 || !info_)
      return Status(StatusCode::kUnavailable, "libfabric provider \"" + provider_in_use_ +
                                                  "\" is not here, or lacks RDM endpoints with RMA (found: " +
                                                  providers_found() + ")");
    virt_addr_ = (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
    local_mr_ = (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
    TANDEM_FI(fabric::api()->fabric(info_->fabric_attr, &fabric_, nullptr));
    TANDEM_FI(fi_domain(fabric_, info_, &domain_, nullptr));
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.wait_obj = FI_WAIT_NONE;
    TANDEM_FI(fi_cq_open(domain_, &cq_attr, &cq_, nullptr));
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    TANDEM_FI(fi_av_open(domain_, &av_attr, &av_, nullptr));
    TANDEM_FI(fi_endpoint(domain_, info_, &ep_, nullptr));
    TANDEM_FI(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV));
    TANDEM_FI(fi_ep_bind(ep_, &av_->fid, 0));
    TANDEM_FI(fi_enable(ep_));
    const std::size_t pool_bytes = std::max<std::size_t>(1, block_bytes_ * static_cast<std::size_t>(n_blocks_));
    TANDEM_FI(fi_mr_reg(domain_, pool_, pool_bytes, FI_WRITE | FI_REMOTE_WRITE, 0, static_cast<uint64_t>(rank_) + 1, 0,
                        &pool_mr_, nullptr));
    slots_ = std::make_unique<uint8_t[]>(2 * kSlots * kSlotBytes);
    TANDEM_FI(fi_mr_reg(domain_, slots_.get(), 2 * kSlots * kSlotBytes, FI_SEND | FI_RECV, 0,
                        static_cast<uint64_t>(size_ + rank_) + 1, 0, &slots_mr_, nullptr));
    if (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) {
      for (fid_mr* mr : {pool_mr_, slots_mr_}) {
        TANDEM_FI(fi_mr_bind(mr, &ep_->fid, 0));
        TANDEM_FI(fi_mr_enable(mr));
      }
    }
    return Status();
  };
  if (Status st = setup(); !st.ok()) problem = st.message();
  // Who could not, said on every rank.
  int ok = problem.empty() ? 1 : 0, all_ok = 0;
  TANDEM_MPI(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm_));
  if (!all_ok) {
    close_fabric();
    return Status(StatusCode::kUnavailable, problem.empty() ? "another rank could not open libfabric" : problem);
  }
  // Addresses, then where each pool is.
  std::vector<uint8_t> name(256);
  std::size_t len = name.size();
  TANDEM_FI(fi_getname(&ep_->fid, name.data(), &len));
  int my_len = static_cast<int>(len), max_len = 0;
  TANDEM_MPI(MPI_Allreduce(&my_len, &max_len, 1, MPI_INT, MPI_MAX, comm_));
  std::vector<uint8_t> names(static_cast<std::size_t>(max_len) * static_cast<std::size_t>(size_));
  name.resize(static_cast<std::size_t>(max_len));
  TANDEM_MPI(MPI_Allgather(name.data(), max_len, MPI_BYTE, names.data(), max_len, MPI_BYTE, comm_));
  struct Where {
    uint64_t base, key;
    int64_t blocks;
    uint64_t block_bytes;
  } mine{virt_addr_ ? reinterpret_cast<uint64_t>(pool_) : 0, fi_mr_key(pool_mr_), n_blocks_, block_bytes_};
  std::vector<Where> all(static_cast<std::size_t>(size_));
  TANDEM_MPI(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm_));
  peers_.resize(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    Peer& p = peers_[static_cast<std::size_t>(r)];
    fi_addr_t a = FI_ADDR_UNSPEC;
    if (fi_av_insert(av_, names.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(max_len), 1, &a, 0, nullptr) != 1)
      return Status(StatusCode::kInternal, "libfabric fi_av_insert: rank " + std::to_string(r) + "'s address was refused");
    p.fi_addr = a;
    p.base = all[static_cast<std::size_t>(r)].base;
    p.key = all[static_cast<std::size_t>(r)].key;
    p.blocks = all[static_cast<std::size_t>(r)].blocks;
    p.block_bytes = all[static_cast<std::size_t>(r)].block_bytes;
    p.capacity = static_cast<uint64_t>(std::max<int64_t>(0, p.blocks)) * p.block_bytes;
  }
  for (int s = 0; s < kSlots; ++s) {
    TANDEM_RETURN_IF_ERROR(post_receive(s));
    free_send_.push_back(kSlots + s);
  }
  return Status();
}

LibfabricTransport::Op* LibfabricTransport::take_op() {
  if (free_ops_.empty()) {
    ops_.push_back(std::make_unique<Op>());
    return ops_.back().get();
  }
  Op* op = free_ops_.back();
  free_ops_.pop_back();
  return op;
}

Status LibfabricTransport::post_receive(int slot) {
  Op* op = take_op();
  op->kind = Op::Kind::kRecv;
  op->slot = slot;
  void* desc = local_mr_ ? fi_mr_desc(slots_mr_) : nullptr;
  for (;;) {
    const ssize_t rc = fi_recv(ep_, slots_.get() + static_cast<std::size_t>(slot) * kSlotBytes, kSlotBytes, desc,
                               FI_ADDR_UNSPEC, &op->ctx);
    if (rc == 0) return Status();
    if (rc != -FI_EAGAIN) return fi_error(static_cast<int>(rc), "fi_recv");
    (void)fi_cq_read(cq_, nullptr, 0);  // the receive queue is full for now: let the provider progress
  }
}

Status LibfabricTransport::post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                                std::span<const uint8_t> notification, XferId& id) {
  return queue_transfer(peer, src, dst, nullptr, notification, id);
}

Status LibfabricTransport::relayout(int peer, std::size_t block_bytes, int64_t n_blocks) {
  const bool known = peer >= 0 && peer < size_ && !peers_.empty();
  TANDEM_RETURN_IF_ERROR(
      check_relayout(peer, size_, known ? peers_[static_cast<std::size_t>(peer)].capacity : 0, block_bytes, n_blocks));
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  p.blocks = n_blocks;
  p.block_bytes = block_bytes;
  if (peer == rank_) block_bytes_ = block_bytes, n_blocks_ = n_blocks;
  return Status();
}

Status LibfabricTransport::post_slice(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                                      const RowSlice& slice, std::span<const uint8_t> notification, XferId& id) {
  return queue_transfer(peer, src, dst, &slice, notification, id);
}

Status LibfabricTransport::queue_transfer(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                                          const RowSlice* slice, std::span<const uint8_t> notification, XferId& id) {
  if (!ep_) return Status(StatusCode::kUnavailable, "pool not created");
  const bool known = peer >= 0 && peer < size_;
  TANDEM_RETURN_IF_ERROR(check_post(peer, size_, src, dst, n_blocks_, known ? peers_[static_cast<std::size_t>(peer)].blocks : 0,
                                    notification.size(), kMaxNotification));
  const Peer& p = peers_[static_cast<std::size_t>(peer)];
  TANDEM_RETURN_IF_ERROR(check_block_bytes(block_bytes_, p.block_bytes, slice));
  Outgoing o;
  o.peer = peer;
  o.notification.assign(notification.begin(), notification.end());
  if (slice) {  // one write per row of each block: our row's slice into the peer's row
    const auto rows = static_cast<std::size_t>(slice->rows), theirs = static_cast<std::size_t>(p.block_bytes);
    const std::size_t our_row = block_bytes_ / rows, their_row = theirs / rows;
    for (std::size_t i = 0; i < src.size(); ++i)
      for (std::size_t r = 0; r < rows; ++r)
        o.unposted.push_back({static_cast<std::size_t>(src[i]) * block_bytes_ + r * our_row + slice->src_offset,
                              static_cast<std::size_t>(dst[i]) * theirs + r * their_row + slice->dst_offset, slice->bytes});
  } else {
    for (const auto& r : coalesce(src, dst)) {
      const std::size_t total = static_cast<std::size_t>(r.count) * block_bytes_;
      for (std::size_t off = 0; off < total; off += kMaxWriteBytes)
        o.unposted.push_back({static_cast<std::size_t>(r.src) * block_bytes_ + off,
                              static_cast<std::size_t>(r.dst) * block_bytes_ + off, std::min(kMaxWriteBytes, total - off)});
    }
  }
  id = next_id_++;
  outgoing_.emplace(id, std::move(o));
  return Status();  // the writes start in poll() and progress()
}

Status LibfabricTransport::post_writes(XferId id, Outgoing& o) {
  const Peer& p = peers_[static_cast<std::size_t>(o.peer)];
  void* desc = local_mr_ ? fi_mr_desc(pool_mr_) : nullptr;
  while (!o.unposted.empty()) {
    const Write& w = o.unposted.front();
    Op* op = take_op();
    op->kind = Op::Kind::kWrite;
    op->id = id;
    iovec iov{pool_ + w.src_offset, w.bytes};
    fi_rma_iov rma{p.base + w.dst_offset, w.bytes, p.key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = p.fi_addr;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = &op->ctx;
    // Delivery complete: the completion comes once the data is in the peer's memory.
    const ssize_t rc = fi_writemsg(ep_, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
    if (rc == -FI_EAGAIN) {
      free_ops_.push_back(op);
      return Status();  // the provider is full: later
    }
    if (rc != 0) {
      free_ops_.push_back(op);
      return fi_error(static_cast<int>(rc), "fi_writemsg");
    }
    ++o.in_flight;
    o.unposted.pop_front();
  }
  return Status();
}

// Posts what it can; once every write has completed at the target, the
// notice (or the notice that the transfer was given up) is queued.
Status LibfabricTransport::advance(XferId id, Outgoing& o) {
  if (o.state != XferState::kPending) return Status();
  if (o.aborted) o.unposted.clear();  // what was written lands; nothing more starts
  if (Status st = post_writes(id, o); !st.ok()) {
    o.aborted = true;  // the peer still hears of it, as aborted
    o.unposted.clear();
    if (o.in_flight == 0) {
      queue_notice(id, o);
      o.state = XferState::kAborted;
    }
    return st;
  }
  if (!o.unposted.empty() || o.in_flight > 0) return Status();
  queue_notice(id, o);
  o.notification.clear();
  o.state = o.aborted ? XferState::kAborted : XferState::kDone;
  return send_notices();
}

void LibfabricTransport::queue_notice(XferId id, const Outgoing& o) {
  std::vector<uint8_t> wire(kHeader + o.notification.size());
  const auto sender = static_cast<int32_t>(rank_);
  const int64_t xfer = id;
  std::memcpy(wire.data(), &sender, 4);
  std::memcpy(wire.data() + 4, &xfer, 8);
  wire[12] = o.aborted ? 1 : 0;
  if (!o.notification.empty()) std::memcpy(wire.data() + kHeader, o.notification.data(), o.notification.size());
  notices_waiting_.emplace_back(o.peer, std::move(wire));
}

Status LibfabricTransport::send_notices() {
  void* desc = local_mr_ ? fi_mr_desc(slots_mr_) : nullptr;
  while (!notices_waiting_.empty() && !free_send_.empty()) {
    auto& [peer, wire] = notices_waiting_.front();
    const int slot = free_send_.back();
    uint8_t* buf = slots_.get() + static_cast<std::size_t>(slot) * kSlotBytes;
    std::memcpy(buf, wire.data(), wire.size());
    Op* op = take_op();
    op->kind = Op::Kind::kSend;
    op->slot = slot;
    const ssize_t rc = fi_send(ep_, buf, wire.size(), desc, peers_[static_cast<std::size_t>(peer)].fi_addr, &op->ctx);
    if (rc == -FI_EAGAIN) {
      free_ops_.push_back(op);
      return Status();
    }
    if (rc != 0) {
      free_ops_.push_back(op);
      return fi_error(static_cast<int>(rc), "fi_send");
    }
    free_send_.pop_back();
    ++sends_in_flight_;
    notices_waiting_.pop_front();
  }
  return Status();
}

Status LibfabricTransport::drain_completions(std::vector<Notification>* arrived) {
  fi_cq_data_entry entries[16];
  for (;;) {
    const ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n == -FI_EAGAIN) return Status();
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) < 1) return Status(StatusCode::kInternal, "libfabric fi_cq_readerr failed");
      auto* op = static_cast<Op*>(err.op_context);
      const std::string why = fi_cq_strerror(cq_, err.prov_errno, err.err_data, nullptr, 0);
      if (op && op->kind == Op::Kind::kWrite) {  // the transfer is given up; its peer hears so
        if (auto it = outgoing_.find(op->id); it != outgoing_.end()) {
          --it->second.in_flight;
          it->second.aborted = true;
        }
        free_ops_.push_back(op);
        continue;
      }
      return Status(StatusCode::kInternal, "libfabric completion error: " + std::string(fabric::api()->strerror(err.err)) + " (" + why + ")");
    }
    if (n < 0) return fi_error(static_cast<int>(n), "fi_cq_read");
    for (ssize_t i = 0; i < n; ++i) {
      auto* op = static_cast<Op*>(entries[i].op_context);
      switch (op->kind) {
        case Op::Kind::kWrite:
          if (auto it = outgoing_.find(op->id); it != outgoing_.end()) --it->second.in_flight;
          free_ops_.push_back(op);
          break;
        case Op::Kind::kSend:
          free_send_.push_back(op->slot);
          --sends_in_flight_;
          free_ops_.push_back(op);
          break;
        case Op::Kind::kRecv: {
          const uint8_t* m = slots_.get() + static_cast<std::size_t>(op->slot) * kSlotBytes;
          if (entries[i].len < kHeader) return Status(StatusCode::kInternal, "a libfabric notification too short to be one");
          int32_t sender = 0;
          std::memcpy(&sender, m, 4);
          Notification note{sender, m[12] != 0, std::vector<uint8_t>(m + kHeader, m + entries[i].len)};
          (arrived ? *arrived : early_).push_back(std::move(note));
          const int slot = op->slot;
          free_ops_.push_back(op);
          TANDEM_RETURN_IF_ERROR(post_receive(slot));
          break;
        }
      }
    }
  }
}

Status LibfabricTransport::poll(XferId id, XferState& state) {
  if (!ep_) return Status(StatusCode::kUnavailable, "pool not created");
  TANDEM_RETURN_IF_ERROR(drain_completions(nullptr));
  return poll_outgoing(outgoing_, id, state, [this](XferId i, Outgoing& o) { return advance(i, o); });
}

Status LibfabricTransport::abort(XferId id) {
  return abort_outgoing(outgoing_, id, [this](XferId i, Outgoing& o) { return advance(i, o); });
}

Status LibfabricTransport::progress(std::vector<Notification>& arrived) {
  if (!ep_) return Status();
  for (auto& n : early_) arrived.push_back(std::move(n));
  early_.clear();
  TANDEM_RETURN_IF_ERROR(drain_completions(&arrived));
  for (auto& [id, o] : outgoing_) TANDEM_RETURN_IF_ERROR(advance(id, o));
  return send_notices();
}

Status LibfabricTransport::destroy() {
  if (!ep_) return Status();
  // Every transfer's notice out before the endpoint goes (the peers may still be waiting for one).
  std::vector<Notification> ignored;
  TANDEM_RETURN_IF_ERROR(finish_in_flight(
      comm_, [&] { return progress(ignored); },
      [&] {
        return any_pending(outgoing_) || sends_in_flight_ > 0 || !notices_waiting_.empty();
      }));
  close_fabric();
  return Status();
}

void LibfabricTransport::close_fabric() {
  // Endpoint first (it holds the posted receives), then what it was bound to.
  for (fid* f : {ep_ ? &ep_->fid : nullptr, pool_mr_ ? &pool_mr_->fid : nullptr, slots_mr_ ? &slots_mr_->fid : nullptr,
                 av_ ? &av_->fid : nullptr, cq_ ? &cq_->fid : nullptr, domain_ ? &domain_->fid : nullptr,
                 fabric_ ? &fabric_->fid : nullptr})
    if (f) fi_close(f);
  ep_ = nullptr, pool_mr_ = slots_mr_ = nullptr, av_ = nullptr, cq_ = nullptr, domain_ = nullptr, fabric_ = nullptr;
  if (info_) fabric::api()->freeinfo(info_);
  info_ = nullptr;
}

}  // namespace tandem::mpi
