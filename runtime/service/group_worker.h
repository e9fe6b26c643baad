// A worker that spans a tensor-parallel group of ranks: replicated control,
// sharded compute.
//
// The group's lowest rank, its leader, is the worker rank 0 and the other
// workers see. It runs the WorkerService and the engine as a one-rank worker
// does (scheduling, the block allocator, the prefix cache, sampling), through
// two wrappers that tell the group's other ranks, its followers, what to do,
// in order, as protocol messages (MsgType::kGroup*):
//  - LeaderBackend: each forward pass's chunks (block tables included) go to
//    every follower before the leader runs its own shard of the pass; the
//    group's exchanges inside the pass (runtime/cpu/tp_group.h) keep the
//    ranks in step. Every rank's pool has the same blocks, and the leader's
//    block numbers hold on every rank.
//  - LeaderPort: each KV transfer the leader posts, ends or receives, and
//    each re-split of the role communicator.
// A Follower runs the same passes on its shard without the LM head (only the
// leader samples), posts its shard of each transfer to the rank at its own
// place in the destination group, and holds its next command until its own
// transfer has ended (so no later pass writes blocks a transfer still reads)
// or its own shard of an incoming one has landed (so no pass reads blocks
// before they are there). Nothing here blocks: a follower that waits polls.
//
// Groups are consecutive world ranks, and a transfer goes between groups of
// the same width: the follower at place i of one group sends to, and
// receives from, place i of the other.
#pragma once

#include <deque>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/engine/backend.h"
#include "runtime/service/worker_port.h"

namespace tandem::service {

// The leader's port: the inner port's, with each KV transfer, arrival and
// re-split told to the followers (world ranks) first.
class LeaderPort : public WorkerPort {
 public:
  LeaderPort(WorkerPort& inner, std::vector<int> followers);
  // To every follower, in order with the other commands.
  void publish(MsgType type, const std::vector<uint8_t>& bytes);

  int rank() const override { return inner_.rank(); }
  bool receive(Message& out) override { return inner_.receive(out); }
  void send(int dest, MsgType type, std::vector<uint8_t> bytes) override { inner_.send(dest, type, std::move(bytes)); }
  bool has_kv() const override { return inner_.has_kv(); }
  int64_t post_kv(int dest, std::span<const int32_t> src, std::span<const int32_t> dst,
                  std::span<const uint8_t> note) override;
  KvState poll_kv(int64_t id) override { return inner_.poll_kv(id); }
  void release_kv(int64_t id) override;
  void kv_arrivals(std::vector<KvArrival>& out) override;
  void begin_resplit(bool prefill) override;
  bool resplit_ready() override { return inner_.resplit_ready(); }
  // The followers split at this point of their commands, never inside a forward pass.
  void split_roles() override;
  // The end of the job: the followers stop, then every message leaves.
  void flush() override;

 private:
  WorkerPort& inner_;
  std::vector<int> followers_;
  std::vector<KvArrival> arrived_;  // scratch
};

// The leader's model: each forward pass goes to the followers, then runs
// here. The device-side draws (forward_argmax, forward_draw) are not offered:
// every pass a follower is told of must run on the leader too.
class LeaderBackend : public runtime::ModelBackend {
 public:
  LeaderBackend(std::unique_ptr<runtime::ModelBackend> inner, LeaderPort& port);
  std::string_view name() const override { return inner_->name(); }
  void forward(std::span<const runtime::SeqChunk> chunks, std::vector<float>& logits) override;

 private:
  std::unique_ptr<runtime::ModelBackend> inner_;
  LeaderPort& port_;
};

// A follower: its leader's commands, run in order on its own shard and port.
class Follower {
 public:
  // place: this rank's index in its group (1..width-1); model: this rank's shard.
  Follower(WorkerPort& port, runtime::ModelBackend& model, int place);
  // One pass over what arrived and what waits; true when anything happened (else back off).
  bool tick();
  // The leader said stop.
  bool finished() const { return stopped_; }

 private:
  // Runs one command; false while it must wait (it stays first in line).
  bool run(const WorkerPort::Message& m);
  bool end_transfer(int64_t leader_id);
  bool landed(int source, const std::vector<uint8_t>& note);

  WorkerPort& port_;
  runtime::ModelBackend& model_;
  int place_;
  std::deque<WorkerPort::Message> commands_;
  std::unordered_map<int64_t, int64_t> transfers_;  // the leader's transfer id -> ours
  std::vector<WorkerPort::KvArrival> arrived_;      // our shards that landed, not yet awaited
  bool stopped_ = false;
  WireForward pass_;
  std::vector<float> logits_;  // stays empty: a follower asks for no logits
};

}  // namespace tandem::service
