#include "runtime/service/group_worker.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/error.h"

namespace tandem::service {

LeaderPort::LeaderPort(WorkerPort& inner, std::vector<int> followers)
    : inner_(inner), followers_(std::move(followers)) {}

void LeaderPort::publish(MsgType type, const std::vector<uint8_t>& bytes) {
  for (int f : followers_) inner_.send(f, type, bytes);
}

int64_t LeaderPort::post_kv(int dest, std::span<const int32_t> src, std::span<const int32_t> dst,
                            std::span<const uint8_t> note) {
  const int64_t id = inner_.post_kv(dest, src, dst, note);
  publish(MsgType::kGroupPostKv, encode(WireGroupPost{dest, {src.begin(), src.end()}, {dst.begin(), dst.end()},
                                                      {note.begin(), note.end()}, id}));
  return id;
}

void LeaderPort::release_kv(int64_t id) {
  // Before the blocks the transfer read can be written again: the followers' next pass comes after this.
  publish(MsgType::kGroupReleaseKv, encode_id(id));
  inner_.release_kv(id);
}

void LeaderPort::kv_arrivals(std::vector<KvArrival>& out) {
  arrived_.clear();
  inner_.kv_arrivals(arrived_);
  for (auto& a : arrived_) {
    // Before any pass reads the blocks: the followers wait for their own shards first.
    publish(MsgType::kGroupAwaitKv, encode(WireGroupAwait{a.source, a.note}));
    out.push_back(std::move(a));
  }
}

void LeaderPort::begin_resplit(bool prefill) {
  publish(MsgType::kGroupResplit, {static_cast<uint8_t>(prefill ? 1 : 0)});
  inner_.begin_resplit(prefill);
}

void LeaderPort::split_roles() {
  // Every pass published before this has run on the followers before they split: the leader ran it too.
  publish(MsgType::kGroupSplit, {});
  inner_.split_roles();
}

void LeaderPort::flush() {
  publish(MsgType::kGroupStop, {});
  inner_.flush();
}

LeaderBackend::LeaderBackend(std::unique_ptr<runtime::ModelBackend> inner, LeaderPort& port)
    : inner_(std::move(inner)), port_(port) {}

void LeaderBackend::forward(std::span<const runtime::SeqChunk> chunks, std::vector<float>& logits) {
  port_.publish(MsgType::kGroupForward, encode_forward(chunks));
  inner_->forward(chunks, logits);
}

Follower::Follower(WorkerPort& port, runtime::ModelBackend& model, int place)
    : port_(port), model_(model), place_(place) {}

bool Follower::tick() {
  bool any = false;
  for (WorkerPort::Message m; port_.receive(m);) {
    commands_.push_back(std::move(m));
    any = true;
  }
  if (port_.has_kv()) {  // our shards of incoming transfers, kept until the leader's command awaits them
    const std::size_t before = arrived_.size();
    port_.kv_arrivals(arrived_);
    any = any || arrived_.size() != before;
  }
  while (!commands_.empty() && run(commands_.front())) {
    commands_.pop_front();
    any = true;
  }
  return any;
}

bool Follower::run(const WorkerPort::Message& m) {
  if (m.source != port_.rank() - place_)
    throw Error("a " + std::string(msg_type_name(m.type)) + " message from rank " + std::to_string(m.source) +
                " reached a tensor-parallel follower (tandem internal error; please report it)");
  switch (m.type) {
    case MsgType::kGroupForward:
      decode_forward(m.bytes, pass_);
      for (auto& c : pass_.chunks) c.logits_last = c.logits_all = false;  // no LM head here: only the leader samples
      model_.forward(pass_.chunks, logits_);
      return true;
    case MsgType::kGroupPostKv: {
      const WireGroupPost p = decode_group_post(m.bytes);
      transfers_[p.id] = port_.post_kv(p.dest + place_, p.src, p.dst, p.note);
      return true;
    }
    case MsgType::kGroupReleaseKv: return end_transfer(decode_id(m.bytes));
    case MsgType::kGroupAwaitKv: {
      const WireGroupAwait a = decode_group_await(m.bytes);
      return landed(a.source + place_, a.note);
    }
    case MsgType::kGroupResplit: port_.begin_resplit(!m.bytes.empty() && m.bytes[0] != 0); return true;
    case MsgType::kGroupSplit:
      if (!port_.resplit_ready()) return false;  // the leader's agreement is done, so ours is about to be
      port_.split_roles();
      return true;
    case MsgType::kGroupStop: stopped_ = true; return true;
    default:
      spdlog::warn("a {} message from rank {} is not for a tensor-parallel follower; ignored", msg_type_name(m.type),
                   m.source);
      return true;
  }
}

bool Follower::end_transfer(int64_t leader_id) {
  const auto it = transfers_.find(leader_id);
  if (it == transfers_.end()) return true;
  if (port_.poll_kv(it->second) == WorkerPort::KvState::kPending) return false;
  port_.release_kv(it->second);
  transfers_.erase(it);
  return true;
}

// Done or aborted alike: either way nothing writes into those blocks any more.
bool Follower::landed(int source, const std::vector<uint8_t>& note) {
  const auto it = std::find_if(arrived_.begin(), arrived_.end(),
                               [&](const WorkerPort::KvArrival& a) { return a.source == source && a.note == note; });
  if (it == arrived_.end()) return false;
  arrived_.erase(it);
  return true;
}

}  // namespace tandem::service
