#include "router/dispatcher.h"

#include <algorithm>

#include "kv/block_hash.h"

namespace tandem::router {

Dispatcher::Dispatcher(WorkerLink& link, DispatchOptions options)
    : link_(link), o_(options), workers_(link.workers()), prefillers_(link.prefill_workers()) {
  for (int w : workers_) load_[w] = 0;
  for (int w : prefillers_) prefill_queue_[w] = 0;
}

Dispatcher::Placement Dispatcher::submit(service::WireRequest r) {
  Placed p;
  if (r.pooling != 0) return submit_embedding(std::move(r));
  const auto n = static_cast<int64_t>(r.prompt.size());
  p.prompt_tokens = n;
  p.blocks = (n + o_.block_size - 1) / o_.block_size;
  const auto hashes = kv::full_block_hashes(r.prompt, o_.block_size);
  auto candidate = [&](int w, int64_t blocks, int64_t requests, int64_t queued) {
    const Overlap ov = kv_index_.overlap(w, hashes);
    return Candidate{w, ov.device, blocks, requests, queued, ov.host, ov.disk};
  };
  std::vector<Candidate> decode, prefill;
  for (int w : workers_) decode.push_back(candidate(w, active_blocks_[w], load_[w], 0));
  for (int w : prefillers_) prefill.push_back(candidate(w, 0, 0, prefill_queue_[w]));
  const PlacementChoice c = place(n, decode, prefill, o_, turn_++);
  p.where.worker = decode[c.worker].rank;
  ++load_[p.where.worker];
  active_blocks_[p.where.worker] += p.blocks;
  if (c.prefill >= 0) {
    p.where.prefill = prefill[static_cast<std::size_t>(c.prefill)].rank;
    prefill_queue_[p.where.prefill] += n;
  }
  r.prefill_rank = p.where.prefill;
  const uint64_t id = r.id;
  link_.submit(p.where.worker, r);
  placed_[id] = p;
  return p.where;
}

// An embedding is a prefill alone: to the prefill worker with the fewest
// tokens queued (it holds no decode KV for it), or without prefill workers
// to the decode worker with the fewest requests.
Dispatcher::Placement Dispatcher::submit_embedding(service::WireRequest r) {
  Placed p;
  for (const auto& in : r.inputs) p.prompt_tokens += static_cast<int64_t>(in.size());
  p.embedding = true;
  r.prefill_rank = -1;
  if (!prefillers_.empty()) {
    int best = prefillers_.front();
    for (int w : prefillers_)
      if (prefill_queue_[w] < prefill_queue_[best]) best = w;
    p.where.worker = best;
    p.on_prefill_worker = true;
    prefill_queue_[best] += p.prompt_tokens;
  } else {
    int best = workers_.front();
    for (int w : workers_)
      if (load_[w] < load_[best]) best = w;
    p.where.worker = best;
    ++load_[best];
  }
  const uint64_t id = r.id;
  link_.submit(p.where.worker, r);
  placed_[id] = p;
  return p.where;
}

void Dispatcher::poll(LinkEvents& events) {
  link_.poll(events);
  using Where = KvIndex::Where;
  for (const auto& e : events.cache_events) {
    kv_index_.stored(e.rank, e.stored);
    kv_index_.removed(e.rank, e.removed);
    kv_index_.stored(e.rank, e.host_stored, Where::kHost);
    kv_index_.removed(e.rank, e.host_removed, Where::kHost);
    kv_index_.stored_on_disk(e.disk_stored);
  }
  for (const auto& r : events.results) {
    auto it = placed_.find(r.id);
    if (it == placed_.end()) continue;
    const Placed& p = it->second;
    if (p.embedding) {
      if (p.on_prefill_worker) prefill_queue_[p.where.worker] -= p.prompt_tokens;
      else --load_[p.where.worker];
      placed_.erase(it);
      continue;
    }
    --load_[p.where.worker];
    active_blocks_[p.where.worker] -= p.blocks;
    if (p.where.prefill >= 0) prefill_queue_[p.where.prefill] -= p.prompt_tokens;
    placed_.erase(it);
  }
}

bool Dispatcher::busy(int rank) const {
  return std::any_of(placed_.begin(), placed_.end(),
                     [rank](const auto& p) { return p.second.where.worker == rank || p.second.where.prefill == rank; });
}

void Dispatcher::refresh() {
  workers_ = link_.workers();
  prefillers_ = link_.prefill_workers();
  for (int w : workers_) load_.try_emplace(w, 0);
  for (int w : prefillers_) prefill_queue_.try_emplace(w, 0);
}

void Dispatcher::cancel(uint64_t id) {
  if (auto it = placed_.find(id); it != placed_.end()) link_.cancel(it->second.where.worker, id);
}

void Dispatcher::cancel_all() {
  for (const auto& [id, p] : placed_) link_.cancel(p.where.worker, id);
}

}  // namespace tandem::router
