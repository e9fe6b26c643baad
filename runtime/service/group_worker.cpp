#include "runtime/service/group_worker.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/error.h"

namespace tandem::service {
namespace {

// The first KV head a place of a group of width w holds, and how many (as runtime/cpu/tp_group.h shards them).
std::pair<int64_t, int64_t> heads_of(int64_t kv_heads, int width, int place) {
  if (kv_heads >= width) return {place * (kv_heads / width), kv_heads / width};
  return {static_cast<int64_t>(place) * kv_heads / width, 1};
}

}  // namespace

std::vector<ShardRoute> shard_routes(int64_t kv_heads, int from, int to) {
  std::vector<ShardRoute> out;
  for (int j = 0; j < to; ++j) {
    const auto [d0, dn] = heads_of(kv_heads, to, j);
    for (int64_t g = d0; g < d0 + dn; ++g) {
      int i = 0;  // the lowest sending place that holds head g
      for (auto h = heads_of(kv_heads, from, i); i + 1 < from && !(h.first <= g && g < h.first + h.second);)
        h = heads_of(kv_heads, from, ++i);
      const int64_t s0 = heads_of(kv_heads, from, i).first;
      ShardRoute* last = out.empty() ? nullptr : &out.back();
      if (last && last->to == j && last->from == i && last->src_head + last->heads == g - s0 &&
          last->dst_head + last->heads == g - d0)
        ++last->heads;
      else
        out.push_back({i, j, g - s0, g - d0, 1});
    }
  }
  return out;
}

ShardMover::ShardMover(WorkerPort& port, int place, int width, topology::GroupMap map, KvShape shape)
    : port_(port), place_(place), width_(width), map_(map), shape_(shape) {}

void ShardMover::post(int64_t key, int dest, std::span<const int32_t> src, std::span<const int32_t> dst,
                      std::span<const uint8_t> note) {
  auto& ids = posts_[key];
  const int theirs = map_.width_at(dest);
  for (const ShardRoute& r : shard_routes(shape_.kv_heads, width_, theirs)) {
    if (r.from != place_) continue;
    const bool whole = r.src_head == 0 && r.dst_head == 0 && r.heads == heads_of(shape_.kv_heads, width_, place_).second &&
                       r.heads == heads_of(shape_.kv_heads, theirs, r.to).second;
    const WorkerPort::KvSlice slice{shape_.rows, static_cast<std::size_t>(r.src_head) * shape_.head_bytes,
                                    static_cast<std::size_t>(r.dst_head) * shape_.head_bytes,
                                    static_cast<std::size_t>(r.heads) * shape_.head_bytes};
    ids.push_back(port_.post_kv(map_.member(dest, r.to), src, dst, note, whole ? nullptr : &slice));
  }
}

WorkerPort::KvState ShardMover::poll(int64_t key) {
  auto it = posts_.find(key);
  if (it == posts_.end()) return WorkerPort::KvState::kDone;
  bool aborted = false;
  for (int64_t id : it->second) {
    const auto st = port_.poll_kv(id);
    if (st == WorkerPort::KvState::kPending) return st;
    aborted = aborted || st == WorkerPort::KvState::kAborted;
  }
  return aborted ? WorkerPort::KvState::kAborted : WorkerPort::KvState::kDone;
}

void ShardMover::release(int64_t key) {
  auto it = posts_.find(key);
  if (it == posts_.end()) return;
  for (int64_t id : it->second) port_.release_kv(id);
  posts_.erase(it);
}

void ShardMover::collect() {
  scratch_.clear();
  port_.kv_arrivals(scratch_);
  for (auto& a : scratch_) {
    Landed& l = landed_[{map_.leader_of(a.source), std::move(a.note)}];
    ++l.count;
    l.aborted = l.aborted || a.aborted;
  }
}

int64_t ShardMover::group_bytes(int dest, int64_t n_blocks) const {
  int64_t heads = 0;
  for (const ShardRoute& r : shard_routes(shape_.kv_heads, width_, map_.width_at(dest))) heads += r.heads;
  return n_blocks * shape_.rows * heads * static_cast<int64_t>(shape_.head_bytes);
}

int ShardMover::pieces_from(int source) const {
  int n = 0;
  for (const ShardRoute& r : shard_routes(shape_.kv_heads, map_.width_at(source), width_)) n += r.to == place_ ? 1 : 0;
  return n;
}

bool ShardMover::take(int source, const std::vector<uint8_t>& note, bool& aborted) {
  auto it = landed_.find({source, note});
  if (it == landed_.end() || it->second.count < pieces_from(source)) return false;
  aborted = it->second.aborted;
  landed_.erase(it);
  return true;
}

void ShardMover::take_complete(std::vector<WorkerPort::KvArrival>& out) {
  for (auto it = landed_.begin(); it != landed_.end();) {
    if (it->second.count < pieces_from(it->first.first)) {
      ++it;
      continue;
    }
    out.push_back({it->first.first, it->second.aborted, it->first.second});
    it = landed_.erase(it);
  }
}

LeaderPort::LeaderPort(WorkerPort& inner, std::vector<int> followers, const topology::GroupMap& map, const KvShape& shape)
    : inner_(inner), followers_(std::move(followers)),
      mover_(inner, 0, static_cast<int>(followers_.size()) + 1, map, shape) {}

void LeaderPort::publish(MsgType type, const std::vector<uint8_t>& bytes) {
  for (int f : followers_) inner_.send(f, type, bytes);
}

int64_t LeaderPort::post_kv(int dest, std::span<const int32_t> src, std::span<const int32_t> dst,
                            std::span<const uint8_t> note, const KvSlice* slice) {
  if (slice) throw Error("a tensor-parallel worker's transfer is sliced by its routes, not by its caller (tandem internal error)");
  const int64_t id = next_id_++;
  publish(MsgType::kGroupPostKv, encode(WireGroupPost{dest, {src.begin(), src.end()}, {dst.begin(), dst.end()},
                                                      {note.begin(), note.end()}, id}));
  mover_.post(id, dest, src, dst, note);
  return id;
}

int64_t LeaderPort::kv_wire_bytes(int dest, int64_t n_blocks, std::size_t) const {
  return mover_.group_bytes(dest, n_blocks);
}

void LeaderPort::release_kv(int64_t id) {
  // Before the blocks the transfer read can be written again: the followers' next pass comes after this.
  publish(MsgType::kGroupReleaseKv, encode_id(id));
  mover_.release(id);
}

void LeaderPort::kv_arrivals(std::vector<KvArrival>& out) {
  mover_.collect();
  const std::size_t first = out.size();
  mover_.take_complete(out);
  // Before any pass reads the blocks: the followers wait for their own shards first.
  for (std::size_t i = first; i < out.size(); ++i)
    publish(MsgType::kGroupAwaitKv, encode(WireGroupAwait{out[i].source, out[i].note}));
}

void LeaderPort::set_group_map(const WireGroupMap& map, const std::vector<uint8_t>& bytes) {
  publish(MsgType::kGroupMap, bytes);
  mover_.set_map(apply_group_map(inner_, map));
}

topology::GroupMap apply_group_map(WorkerPort& port, const WireGroupMap& m) {
  std::vector<std::vector<int>> prefill, decode;
  for (const auto& g : m.groups) {
    for (int r : g.ranks) port.relayout_kv(r, static_cast<std::size_t>(g.block_bytes), g.blocks);
    (g.prefill ? prefill : decode).push_back(g.ranks);
  }
  return topology::GroupMap(std::move(prefill), std::move(decode));
}

void LeaderPort::flush() {
  publish(MsgType::kGroupStop, stop_note_);
  inner_.flush();
}

LeaderBackend::LeaderBackend(std::unique_ptr<runtime::ModelBackend> inner, LeaderPort& port)
    : inner_(std::move(inner)), port_(port) {}

void LeaderBackend::forward(std::span<const runtime::SeqChunk> chunks, std::vector<float>& logits) {
  port_.publish(MsgType::kGroupForward, encode_forward(chunks));
  inner_->forward(chunks, logits);
}

bool LeaderBackend::forward_argmax(std::span<const runtime::SeqChunk> chunks, std::vector<int32_t>& tokens) {
  if (!inner_->has_argmax()) return false;  // nothing runs, so the followers hear of nothing
  port_.publish(MsgType::kGroupForward, encode_forward(chunks));
  if (!inner_->forward_argmax(chunks, tokens)) throw Error("internal: a model that has forward_argmax did not run it");
  return true;
}

bool LeaderBackend::forward_draw(std::span<const runtime::SeqChunk> chunks, std::span<const runtime::DeviceDraw> draws,
                                 std::vector<int32_t>& tokens) {
  if (!inner_->has_draw()) return false;
  port_.publish(MsgType::kGroupForward, encode_forward(chunks));
  if (!inner_->forward_draw(chunks, draws, tokens)) throw Error("internal: a model that has forward_draw did not run it");
  return true;
}

GroupBlocks::GroupBlocks(runtime::cpu::TpGroup& group, kv::BlockPool& pool, const KvShape& shape, kv::PoolCopy copy)
    : group_(group),
      pool_(pool),
      shape_(shape),
      copy_(std::move(copy)),
      place_(group.shard().rank),
      width_(group.shard().width),
      shard_bytes_(static_cast<int64_t>(pool.layout().block_bytes())),
      whole_bytes_(shape.rows * shape.kv_heads * static_cast<int64_t>(shape.head_bytes)) {
  if (shard_bytes_ != shape.rows * heads_of(shape.kv_heads, width_, place_).second * static_cast<int64_t>(shape.head_bytes))
    throw Error("a tensor-parallel pool's blocks are not its share of the model's KV heads (tandem internal error)");
}

// Each route: heads [src_head, +heads) of place `from`'s row -> [dst_head, ...) of place `to`'s, for every row of every block.
namespace {

void copy_heads(const ShardRoute& r, const KvShape& shape, int64_t n_blocks, const uint8_t* src, int64_t src_block,
                int64_t src_row, uint8_t* dst, int64_t dst_block, int64_t dst_row) {
  const auto hb = static_cast<int64_t>(shape.head_bytes);
  for (int64_t i = 0; i < n_blocks; ++i)
    for (int64_t row = 0; row < shape.rows; ++row)
      std::memcpy(dst + i * dst_block + row * dst_row + r.dst_head * hb, src + i * src_block + row * src_row + r.src_head * hb,
                  static_cast<std::size_t>(r.heads * hb));
}

}  // namespace

void GroupBlocks::copy_block(uint8_t* host, int32_t block, bool to_pool) {
  auto* at = reinterpret_cast<uint8_t*>(pool_.data()) + block * shard_bytes_;
  const auto bytes = static_cast<std::size_t>(shard_bytes_);
  if (copy_) copy_(to_pool ? at : host, to_pool ? host : at, bytes, to_pool);
  else if (to_pool) std::memcpy(at, host, bytes);
  else std::memcpy(host, at, bytes);
}

void GroupBlocks::gather(std::span<const int32_t> blocks, std::vector<float>* whole) {
  const auto n = static_cast<int64_t>(blocks.size());
  mine_.resize(static_cast<std::size_t>(n * shard_bytes_));
  for (int64_t i = 0; i < n; ++i) copy_block(mine_.data() + i * shard_bytes_, blocks[static_cast<std::size_t>(i)], false);
  if (place_ == 0) all_.resize(static_cast<std::size_t>(width_ * n * shard_bytes_));
  group_.gather(mine_.data(), mine_.size(), all_.data());
  if (place_ != 0 || !whole) return;
  whole->resize(static_cast<std::size_t>(n * whole_floats()));
  const int64_t shard_row = shard_bytes_ / shape_.rows, whole_row = whole_bytes_ / shape_.rows;
  for (const ShardRoute& r : shard_routes(shape_.kv_heads, width_, 1))
    copy_heads(r, shape_, n, all_.data() + r.from * n * shard_bytes_, shard_bytes_, shard_row,
               reinterpret_cast<uint8_t*>(whole->data()), whole_bytes_, whole_row);
}

void GroupBlocks::scatter(std::span<const int32_t> blocks, const float* whole) {
  const auto n = static_cast<int64_t>(blocks.size());
  if (place_ == 0) {
    all_.resize(static_cast<std::size_t>(width_ * n * shard_bytes_));
    const int64_t shard_row = shard_bytes_ / shape_.rows, whole_row = whole_bytes_ / shape_.rows;
    for (const ShardRoute& r : shard_routes(shape_.kv_heads, 1, width_))
      copy_heads(r, shape_, n, reinterpret_cast<const uint8_t*>(whole), whole_bytes_, whole_row,
                 all_.data() + r.to * n * shard_bytes_, shard_bytes_, shard_row);
  }
  mine_.resize(static_cast<std::size_t>(n * shard_bytes_));
  group_.scatter(all_.data(), mine_.size(), mine_.data());
  for (int64_t i = 0; i < n; ++i) copy_block(mine_.data() + i * shard_bytes_, blocks[static_cast<std::size_t>(i)], true);
}

GroupTier::GroupTier(kv::KvTiers& tiers, GroupBlocks& blocks, LeaderPort& port, const kv::BlockPool& pool)
    : tiers_(tiers), blocks_(blocks), port_(port), pool_(pool) {}

int32_t GroupTier::block_of(const float* data) const {
  return static_cast<int32_t>((data - pool_.data()) / pool_.layout().block_floats());
}

const float* GroupTier::gather(const float* data) {
  const int32_t b = block_of(data);
  port_.publish(MsgType::kGroupSaveBlocks, encode_blocks({&b, 1}));
  blocks_.gather({&b, 1}, &whole_);
  return whole_.data();
}

void GroupTier::evicted(uint64_t hash, const float* data, int64_t uses) {
  tiers_.evicted(hash, tiers_.reads_evicted(hash) ? gather(data) : nullptr, uses);
}

void GroupTier::used(uint64_t hash, const float* data, int64_t uses) {
  if (tiers_.reads_used(hash, uses)) tiers_.used(hash, gather(data), uses);
}

std::optional<kv::LowerTier::Found> GroupTier::onboard(uint64_t hash, float* dst) {
  whole_.resize(static_cast<std::size_t>(blocks_.whole_floats()));
  const auto found = tiers_.onboard(hash, whole_.data());
  if (!found) return found;
  const int32_t b = block_of(dst);
  port_.publish(MsgType::kGroupLoadBlocks, encode_blocks({&b, 1}));
  blocks_.scatter({&b, 1}, whole_.data());
  return found;
}

Follower::Follower(WorkerPort& port, runtime::ModelBackend& model, int place, int width, const topology::GroupMap& map,
                   const KvShape& shape, GroupBlocks& blocks)
    : port_(port), model_(model), leader_(map.leader_of(port.rank())), mover_(port, place, width, map, shape), blocks_(blocks) {}

bool Follower::tick() {
  bool any = false;
  for (WorkerPort::Message m; !stopped_ && port_.receive(m);) {
    if (m.type == MsgType::kPing) continue;  // rank 0's, sent while this rank led a worker (a regroup)
    if (m.type == MsgType::kGroupStop) stopped_ = true;  // nothing after it is this group's (the next one's, a regroup's)
    if (m.type == MsgType::kGroupMap && m.source == leader_) {
      // At once, not in its turn: pieces from the new workers may land before the commands ahead of it have run
      // (and nothing those commands touch changed: only cells with nothing in flight regroup).
      mover_.set_map(apply_group_map(port_, decode_group_map(m.bytes)));
      any = true;
      continue;
    }
    commands_.push_back(std::move(m));
    any = true;
  }
  if (port_.has_kv()) mover_.collect();  // our shards of incoming transfers, kept until the leader's command awaits them
  while (!commands_.empty() && run(commands_.front())) {
    commands_.pop_front();
    any = true;
  }
  return any;
}

bool Follower::run(const WorkerPort::Message& m) {
  if (m.source != leader_)
    throw Error("a " + std::string(msg_type_name(m.type)) + " message from rank " + std::to_string(m.source) +
                " reached a tensor-parallel follower (tandem internal error; please report it)");
  switch (m.type) {
    case MsgType::kGroupForward:
      decode_forward(m.bytes, pass_);
      model_.forward_follower(pass_.chunks, logits_);  // no LM head here: only the leader samples
      return true;
    case MsgType::kGroupPostKv: {
      const WireGroupPost p = decode_group_post(m.bytes);
      mover_.post(p.id, p.dest, p.src, p.dst, p.note);
      return true;
    }
    case MsgType::kGroupReleaseKv: {
      const int64_t id = decode_id(m.bytes);
      if (mover_.poll(id) == WorkerPort::KvState::kPending) return false;  // ours still reads those blocks
      mover_.release(id);
      return true;
    }
    case MsgType::kGroupAwaitKv: {  // done or aborted alike: nothing writes into those blocks any more
      const WireGroupAwait a = decode_group_await(m.bytes);
      bool aborted = false;
      return mover_.take(a.source, a.note, aborted);
    }
    case MsgType::kGroupSaveBlocks: blocks_.gather(decode_blocks(m.bytes), nullptr); return true;
    case MsgType::kGroupLoadBlocks: blocks_.scatter(decode_blocks(m.bytes), nullptr); return true;
    case MsgType::kGroupStop: stop_note_ = m.bytes; return true;
    default:
      spdlog::warn("a {} message from rank {} is not for a tensor-parallel follower; ignored", msg_type_name(m.type),
                   m.source);
      return true;
  }
}

}  // namespace tandem::service
