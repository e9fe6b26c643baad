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
//  - LeaderPort: each KV transfer the leader posts, ends or receives.
// Re-splits between epochs move whole groups: the leader takes its new role
// at once; the followers have none.
// A Follower runs the same passes on its shard without the LM head (only the
// leader samples), posts its shard of each transfer to the rank at its own
// place in the destination group, and holds its next command until its own
// transfer has ended (so no later pass writes blocks a transfer still reads)
// or its own shard of an incoming one has landed (so no pass reads blocks
// before they are there). Nothing here blocks: a follower that waits polls.
//
// The tiers below the leader's pool (kv/tiers.h: host memory, the HDF5
// store) hold whole blocks, every KV head, as a one-rank worker's do: a
// block goes down gathered from the group's shards and comes back up
// scattered to them (GroupBlocks, GroupTier), so a store written at one
// width is read at any other.
//
// Groups are consecutive world ranks. Between groups of different widths
// (prefill_tp != decode_tp) each rank of the sending group sends the KV
// heads it holds to the receiving ranks that hold them, as slices of each
// block's rows (shard_routes): the receiving group gets the prompt's KV
// once per copy it keeps (once, unless its width passes the KV heads).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "kv/tiers.h"
#include "runtime/cpu/tp_group.h"
#include "runtime/engine/backend.h"
#include "topology/group_map.h"
#include "runtime/service/worker_port.h"

namespace tandem::service {

// The KV heads of a model as its transfers see them: how many, the rows of a
// block (layers x K and V x block_size) and one head's bytes in a row.
struct KvShape {
  int64_t kv_heads = 1, rows = 1;
  std::size_t head_bytes = 0;
};

// One rank's share of a transfer between a group of width `from` and one of
// width `to`: heads [src_head, src_head + heads) of the sending place's shard
// go to [dst_head, ...) of the receiving place's. Each receiving place gets
// each of its heads once, from the lowest sending place that holds it.
struct ShardRoute {
  int from = 0, to = 0;
  int64_t src_head = 0, dst_head = 0, heads = 0;
};
std::vector<ShardRoute> shard_routes(int64_t kv_heads, int from, int to);

// One rank's part in the group's KV transfers: the posts of its routes,
// polled and released together under the leader's id, and the pieces that
// land here, counted until every route to this rank has delivered.
class ShardMover {
 public:
  ShardMover(WorkerPort& port, int place, int width, topology::GroupMap map, KvShape shape);
  // Our routes of a transfer of blocks src -> dst to the group led by `dest`, under `key`.
  void post(int64_t key, int dest, std::span<const int32_t> src, std::span<const int32_t> dst,
            std::span<const uint8_t> note);
  WorkerPort::KvState poll(int64_t key);  // every post done; aborted if any was
  void release(int64_t key);
  // What landed here, counted by (sending group's leader, note).
  void collect();
  // Takes a transfer from the group led by `source` whose every piece to us has landed.
  bool take(int source, const std::vector<uint8_t>& note, bool& aborted);
  // Takes every transfer whose every piece to us has landed.
  void take_complete(std::vector<WorkerPort::KvArrival>& out);
  // What every place's routes to the group led by `dest` move for n blocks.
  int64_t group_bytes(int dest, int64_t n_blocks) const;
  // The workers after a regroup (no transfer in flight to or from one that changed).
  void set_map(topology::GroupMap map) { map_ = std::move(map); }

 private:
  int pieces_from(int source) const;  // the routes from the group led by `source` that end here
  struct Landed {
    int count = 0;
    bool aborted = false;
  };
  WorkerPort& port_;
  int place_, width_;
  topology::GroupMap map_;
  KvShape shape_;
  std::unordered_map<int64_t, std::vector<int64_t>> posts_;  // key -> our transfers
  std::map<std::pair<int, std::vector<uint8_t>>, Landed> landed_;
  std::vector<WorkerPort::KvArrival> scratch_;
};

// A group's KV blocks whole. Each rank's pool holds its shard of a block
// (its KV heads of every row); these collectives over the group join the
// shards of blocks on the leader (a head held by several ranks is taken
// from the lowest) and part whole blocks out again.
class GroupBlocks {
 public:
  // pool: this rank's; shape: the model's KV heads, a block's rows, one head's bytes; copy: how to
  // reach a pool in device memory (runtime::pool_copy; empty for a host pool).
  GroupBlocks(runtime::cpu::TpGroup& group, kv::BlockPool& pool, const KvShape& shape, kv::PoolCopy copy = {});
  // A whole block's floats (the pool's layout with every KV head).
  int64_t whole_floats() const { return whole_bytes_ / 4; }
  // Every rank sends its shards of `blocks`; the leader gets the whole blocks in `whole` (null elsewhere).
  void gather(std::span<const int32_t> blocks, std::vector<float>* whole);
  // The leader's whole blocks (`whole`; null elsewhere) into every rank's `blocks`.
  void scatter(std::span<const int32_t> blocks, const float* whole);

 private:
  // One block between the pool and host memory (to_pool: host -> pool).
  void copy_block(uint8_t* host, int32_t block, bool to_pool);
  runtime::cpu::TpGroup& group_;
  kv::BlockPool& pool_;
  KvShape shape_;
  kv::PoolCopy copy_;
  int place_, width_;
  int64_t shard_bytes_, whole_bytes_;
  std::vector<uint8_t> mine_, all_;
};

// The leader's port: the inner port's, with each KV transfer and arrival
// told to the followers (world ranks) first; a re-split is the leader's alone
// (followers have no role).
class LeaderPort : public WorkerPort {
 public:
  // followers: world ranks (none for a one-rank worker in a job whose other
  // workers are groups: its transfers still follow the routes).
  LeaderPort(WorkerPort& inner, std::vector<int> followers, const topology::GroupMap& map, const KvShape& shape);
  // To every follower, in order with the other commands.
  void publish(MsgType type, const std::vector<uint8_t>& bytes);

  int rank() const override { return inner_.rank(); }
  bool receive(Message& out) override { return inner_.receive(out); }
  void send(int dest, MsgType type, std::vector<uint8_t> bytes) override { inner_.send(dest, type, std::move(bytes)); }
  bool has_kv() const override { return inner_.has_kv(); }
  // The leader's id of the group's transfer (whole blocks only: the routes slice them).
  int64_t post_kv(int dest, std::span<const int32_t> src, std::span<const int32_t> dst,
                  std::span<const uint8_t> note, const KvSlice* slice = nullptr) override;
  int64_t kv_wire_bytes(int dest, int64_t n_blocks, std::size_t block_bytes) const override;
  KvState poll_kv(int64_t id) override { return mover_.poll(id); }
  void release_kv(int64_t id) override;
  void kv_arrivals(std::vector<KvArrival>& out) override;
  // The workers after a regroup: to the followers first, then each changed pool relaid here.
  void set_group_map(const WireGroupMap& map, const std::vector<uint8_t>& bytes) override;
  // What the followers' stop says (flush): empty at the end of the job; a
  // regroup's WireRoles when the group regroups at another width.
  void set_stop_note(std::vector<uint8_t> note) { stop_note_ = std::move(note); }
  // The end of the job or of this group: the followers stop, then every message leaves.
  void flush() override;

 private:
  WorkerPort& inner_;
  std::vector<int> followers_;
  ShardMover mover_;
  int64_t next_id_ = 1;
  std::vector<uint8_t> stop_note_;
};

// The GroupMap of a kGroupMap, with every pool it lists relaid at `port`
// (unchanged ones to what they were).
topology::GroupMap apply_group_map(WorkerPort& port, const WireGroupMap& m);

// The leader's model: each forward pass goes to the followers, then runs
// here. The device-side draws (forward_argmax, forward_draw) are offered
// where the model has them, the pass told to the followers first (every pass
// a follower is told of must run on the leader too).
class LeaderBackend : public runtime::ModelBackend {
 public:
  LeaderBackend(std::unique_ptr<runtime::ModelBackend> inner, LeaderPort& port);
  std::string_view name() const override { return inner_->name(); }
  std::vector<int64_t> expert_tokens() const override { return inner_->expert_tokens(); }
  int expert_ranks() const override { return inner_->expert_ranks(); }
  void forward(std::span<const runtime::SeqChunk> chunks, std::vector<float>& logits) override;
  // The leader's tokens drawn where its logits are (a GPU's), when its model can: the followers run the
  // same pass, which they always run without the LM head.
  bool forward_argmax(std::span<const runtime::SeqChunk> chunks, std::vector<int32_t>& tokens) override;
  bool forward_draw(std::span<const runtime::SeqChunk> chunks, std::span<const runtime::DeviceDraw> draws,
                    std::vector<int32_t>& tokens) override;
  bool has_argmax() const override { return inner_->has_argmax(); }
  bool hidden_rows(std::vector<float>& rows) override { return inner_->hidden_rows(rows); }  // the leader's own
  bool has_hidden_rows() const override { return inner_->has_hidden_rows(); }
  bool has_lm_head() const override { return inner_->has_lm_head(); }
  bool has_draw() const override { return inner_->has_draw(); }

 private:
  std::unique_ptr<runtime::ModelBackend> inner_;
  LeaderPort& port_;
};

// The tiers below a tensor-parallel leader's pool, as its pool sees them:
// a block they take is gathered from the group first, and one they give is
// scattered to it (the followers told in order, as of a pass). Only what the
// tiers will read moves: a block already in host memory is not gathered again.
class GroupTier : public kv::LowerTier {
 public:
  GroupTier(kv::KvTiers& tiers, GroupBlocks& blocks, LeaderPort& port, const kv::BlockPool& pool);
  void evicted(uint64_t hash, const float* data, int64_t uses) override;
  void used(uint64_t hash, const float* data, int64_t uses) override;
  bool holds(uint64_t hash) const override { return tiers_.holds(hash); }
  std::optional<Found> onboard(uint64_t hash, float* dst) override;

 private:
  int32_t block_of(const float* data) const;
  const float* gather(const float* data);  // the whole block of the pool's block at data

  kv::KvTiers& tiers_;
  GroupBlocks& blocks_;
  LeaderPort& port_;
  const kv::BlockPool& pool_;
  std::vector<float> whole_;
};

// A follower: its leader's commands, run in order on its own shard and port.
class Follower {
 public:
  // place: this rank's index in its group (1..width-1); model: this rank's
  // shard; blocks: its pool's blocks for the tiers below the leader's.
  Follower(WorkerPort& port, runtime::ModelBackend& model, int place, int width, const topology::GroupMap& map,
           const KvShape& shape, GroupBlocks& blocks);
  // One pass over what arrived and what waits; true when anything happened (else back off).
  bool tick();
  // The leader said stop.
  bool finished() const { return stopped_ && commands_.empty(); }
  // What it said with it (LeaderPort::set_stop_note): empty, or the regroup's WireRoles.
  const std::vector<uint8_t>& stop_note() const { return stop_note_; }

 private:
  // Runs one command; false while it must wait (it stays first in line).
  bool run(const WorkerPort::Message& m);

  WorkerPort& port_;
  runtime::ModelBackend& model_;
  int leader_;  // the only rank whose commands a follower runs
  ShardMover mover_;
  GroupBlocks& blocks_;
  std::deque<WorkerPort::Message> commands_;
  bool stopped_ = false;
  std::vector<uint8_t> stop_note_;
  WireForward pass_;
  std::vector<float> logits_;  // stays empty: a follower asks for no logits
};

}  // namespace tandem::service
