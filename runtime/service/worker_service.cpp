#include "runtime/service/worker_service.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace tandem::service {

WorkerService::WorkerService(WorkerCore& core, WorkerPort& port, std::function<void(Role)> on_role)
    : core_(core), port_(port), on_role_(std::move(on_role)) {
  // Counters for rank 0's /health and /metrics: now (this one says the model
  // is loaded), then every half second.
  port_.send(0, MsgType::kStats, encode(core_.report()));
}

template <class F>
auto WorkerService::timed(F&& call) {
  const auto t0 = Clock::now();
  auto result = call();
  kv_wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

bool WorkerService::tick() {
  bool any = receive_messages();
  any = reserve_for_prefill() || any;
  any = step_engine() || any;
  any = drive_transfers() || any;
  report_now_and_then();
  // Only in a pass with nothing to do: after a long engine step the pings that came meanwhile are still to be read.
  if (!any && router_timeout_s_ > 0) {
    const double silent = std::chrono::duration<double>(Clock::now() - heard_router_).count();
    if (silent > router_timeout_s_)
      throw RouterLost("rank 0 (the router) not heard from for " + std::to_string(static_cast<int>(silent)) +
                       " s (job.worker_timeout_seconds): this worker's node is cut off from it, or it hangs; this "
                       "worker ends (the job's output is rank 0's: rerun with --resume once the job is gone)");
  }
  return any;
}

bool WorkerService::receive_messages() {
  bool any = false;
  for (WorkerPort::Message m; port_.receive(m);) {
    any = true;
    if (m.source == 0) heard_router_ = Clock::now();
    switch (m.type) {
      case MsgType::kPing: break;
      case MsgType::kRequest: on_request(decode_request(m.bytes)); break;
      case MsgType::kPrefill: on_prefill(decode_prefill(m.bytes)); break;
      case MsgType::kCancel: on_cancel(m.source, decode_cancel(m.bytes)); break;
      case MsgType::kRoles: on_roles(decode_roles(m.bytes)); break;
      case MsgType::kShutdown: on_shutdown(!m.bytes.empty() && m.bytes[0] != 0); break;
      case MsgType::kRegroup:
        regroup_ = std::move(m.bytes);
        on_shutdown(false);
        break;
      case MsgType::kGroupMap: on_group_map(m.bytes); break;
      default:
        spdlog::warn("a {} message from rank {} is not for a worker; ignored", msg_type_name(m.type), m.source);
    }
  }
  return any;
}

void WorkerService::on_request(WireRequest r) {
  if (r.prefill_rank < 0) core_.submit(r);
  else if (core_.fits(r)) to_reserve_.emplace_back(std::move(r), Clock::now());
  // else: it could never get its blocks here; refused now (the 400 goes out with the next step)
}

void WorkerService::on_prefill(WirePrefill p) {
  destinations_[p.request.id] = {std::move(p.dst_blocks), p.decode_rank, p.skip_blocks};
  core_.submit(p.request, /*prefill_only=*/true);
}

// From rank 0: the client went away; free the request's blocks wherever it is.
// From a prefill rank: it refused the request (rank 0 has its error), no KV will come.
void WorkerService::on_cancel(int source, uint64_t id) {
  if (source != 0) {
    if (auto it = awaiting_.find(id); it != awaiting_.end()) {
      core_.release(it->second.blocks);
      awaiting_.erase(it);
    }
    return;
  }
  if (auto it = awaiting_.find(id); it != awaiting_.end()) {
    it->second.cancelled = true;  // its KV still lands in these blocks; they go then
  } else if (auto q = std::find_if(to_reserve_.begin(), to_reserve_.end(),
                                   [id](const auto& e) { return e.first.id == id; });
             q != to_reserve_.end()) {
    to_reserve_.erase(q);
    core_.abort_outside(id);
  } else {
    core_.cancel(id);
  }
}

// A re-split: this worker's role from now on. Nothing waits on the other
// workers: rank 0 sends new work by the new roles only after this message
// (MPI keeps one sender's messages in order), and what this worker holds
// (sequences, prefills, transfers either way) runs on to its end.
void WorkerService::on_roles(WireRoles r) {
  const bool prefill = std::find(r.prefill_ranks.begin(), r.prefill_ranks.end(), port_.rank()) != r.prefill_ranks.end();
  const Role role = role_for(!r.prefill_ranks.empty(), prefill ? topology::Side::kPrefill : topology::Side::kDecode);
  core_.set_role(role);
  if (on_role_) on_role_(role);
  spdlog::debug("epoch {}: now {}", r.epoch, role_name(role));
}

void WorkerService::on_shutdown(bool abandon) {
  stopping_ = true;
  abandon_ = abandon;
}

// Other cells regrouped: KV to and from their workers follows the new map,
// here and (a group's leader tells them) on the followers, before rank 0
// hears that this worker is ready for it.
void WorkerService::on_group_map(const std::vector<uint8_t>& bytes) {
  const WireGroupMap map = decode_group_map(bytes);
  port_.set_group_map(map, bytes);
  port_.send(0, MsgType::kGroupMapAck, encode_id(map.serial));
}

// Decode side: a prefill's KV has landed in the blocks reserved for it (or, aborted, will not).
void WorkerService::on_kv_arrived(const WorkerPort::KvArrival& a) {
  const WireKvReady ready = decode_kv_ready(a.note);
  auto it = awaiting_.find(ready.id);
  if (it == awaiting_.end()) return;
  if (a.aborted || it->second.cancelled) {
    core_.release(it->second.blocks);
    core_.abort_outside(ready.id);
    awaiting_.erase(it);
    return;
  }
  core_.add_prefilled(it->second.request, std::move(it->second.blocks), ready, it->second.arrival, it->second.moved);
  awaiting_.erase(it);
}

// Decode side (oldest first): keep the prompt's prefix this rank has cached,
// reserve blocks for the rest, and send the prefill off; only the blocks
// after the cached prefix will travel.
bool WorkerService::reserve_for_prefill() {
  bool any = false;
  while (!to_reserve_.empty()) {
    auto& [r, arrival] = to_reserve_.front();
    if (!core_.prefix_ready(r.prompt)) break;  // its stored prefix is on the way up from disk
    auto cached = core_.cached_prefix(r.prompt);
    const int64_t bs = core_.block_size();
    const int64_t total = (static_cast<int64_t>(r.prompt.size()) + bs - 1) / bs;
    const auto n_cached = static_cast<int64_t>(cached.size());
    auto fresh = core_.reserve((total - n_cached) * bs);
    if (!fresh) {  // retried when finished sequences free blocks
      core_.release(cached);
      break;
    }
    const int prefill_rank = r.prefill_rank;
    port_.send(prefill_rank, MsgType::kPrefill, encode(WirePrefill{r, *fresh, port_.rank(), n_cached}));
    cached.insert(cached.end(), fresh->begin(), fresh->end());
    awaiting_[r.id] = {std::move(r), std::move(cached), arrival, total - n_cached, false};
    to_reserve_.pop_front();
    any = true;
  }
  return any;
}

bool WorkerService::step_engine() {
  if (!core_.has_work()) return false;
  auto out = core_.step();
  if (!out.deltas.deltas.empty()) port_.send(0, MsgType::kDeltas, encode(out.deltas));
  for (auto& r : out.results) {
    // Refused on a prefill rank: rank 0 hears it from here, and the decode
    // rank frees the blocks it reserved for the KV that will not come.
    if (auto d = destinations_.find(r.id); !r.ok && d != destinations_.end()) {
      port_.send(d->second.decode_rank, MsgType::kCancel, encode_cancel(r.id));
      destinations_.erase(d);
    }
    port_.send(0, MsgType::kResult, encode(r));
  }
  for (auto& h : out.handoffs) send_handoff(h);
  return out.progress || !out.handoffs.empty();
}

// A finished prefill: its KV into the decode rank's blocks, the handoff as the
// transfer's notification. Its blocks stay ours until the transfer is done.
void WorkerService::send_handoff(WorkerCore::Handoff& h) {
  auto d = destinations_.find(h.id);
  if (d == destinations_.end() || !port_.has_kv()) {
    core_.release(h.kv_blocks);
    return;
  }
  const auto skip = std::min<std::size_t>(static_cast<std::size_t>(d->second.skip), h.kv_blocks.size());
  const auto n = std::min(h.kv_blocks.size() - skip, d->second.blocks.size());
  Sending s;
  s.dest = d->second.decode_rank;
  s.bytes = static_cast<std::size_t>(port_.kv_wire_bytes(d->second.decode_rank, static_cast<int64_t>(n), core_.block_bytes()));
  const auto note = encode(h.ready);
  s.id = timed([&] {
    return port_.post_kv(d->second.decode_rank, std::span<const int32_t>(h.kv_blocks).subspan(skip, n),
                         std::span<const int32_t>(d->second.blocks).first(n), note);
  });
  s.blocks = std::move(h.kv_blocks);
  const auto now = Clock::now();
  sending_all_.start(now);
  sending_to_[s.dest].start(now);
  sending_.push_back(std::move(s));
  destinations_.erase(d);
}

// Transfers: ours that ended free their blocks; those to us hand their requests to the engine.
bool WorkerService::drive_transfers() {
  if (!port_.has_kv()) return false;
  arrivals_.clear();
  timed([&] {
    port_.kv_arrivals(arrivals_);
    return 0;
  });
  for (const auto& a : arrivals_) on_kv_arrived(a);
  bool any = !arrivals_.empty();
  for (auto it = sending_.begin(); it != sending_.end();) {
    const auto st = timed([&] { return port_.poll_kv(it->id); });
    if (st == WorkerPort::KvState::kPending) {
      ++it;
      continue;
    }
    if (st == WorkerPort::KvState::kDone) core_.count_kv_sent(it->dest, static_cast<int64_t>(it->bytes));
    const auto now = Clock::now();
    core_.count_kv_time(sending_all_.stop(now), it->dest, sending_to_[it->dest].stop(now));
    core_.release(it->blocks);
    port_.release_kv(it->id);
    it = sending_.erase(it);
    any = true;
  }
  core_.set_kv_wait_seconds(kv_wait_s_);
  return any;
}

void WorkerService::report_now_and_then() {
  // What the prefix cache gained and lost (for rank 0's KV-aware routing), at most every 20 ms.
  if (Clock::now() - last_cache_report_ > std::chrono::milliseconds(20)) {
    WireCacheEvents events;
    if (core_.drain_cache_events(events)) port_.send(0, MsgType::kCacheEvents, encode(events));
    last_cache_report_ = Clock::now();
  }
  if (Clock::now() - last_stats_ > std::chrono::milliseconds(500)) {
    auto report = core_.report();
    report.step_samples = core_.take_step_samples();
    port_.send(0, MsgType::kStats, encode(report));
    last_stats_ = Clock::now();
  }
}

bool WorkerService::finished() const {
  if (!stopping_) return false;
  return abandon_ || (!core_.has_work() && awaiting_.empty() && to_reserve_.empty() && sending_.empty());
}

void WorkerService::finish() {
  if (regroup_.empty()) core_.close_tiers();  // a regroup keeps them: the rank's next worker reads them
  auto final_report = core_.report();
  final_report.step_samples = core_.take_step_samples();
  port_.send(0, MsgType::kReport, encode(final_report));
  port_.flush();
}

}  // namespace tandem::service
