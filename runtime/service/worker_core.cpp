#include "runtime/service/worker_core.h"

#include <algorithm>
#include <string_view>
#include <type_traits>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "kv/block_hash.h"

namespace tandem::service {

WorkerCore::WorkerCore(int rank, Role role, const runtime::ModelConfig& config,
                       std::unique_ptr<runtime::ModelBackend> backend, kv::BlockPool& pool,
                       const runtime::Tokenizer* tokenizer, runtime::EngineOptions options, kv::KvTiers* tiers)
    : rank_(rank), role_(role), pool_(pool), tiers_(tiers), config_experts_(config.moe.experts),
      engine_(config, std::move(backend), pool, tokenizer, options) {}

void WorkerCore::submit(const WireRequest& w, bool prefill_only) {
  if (w.pooling != 0) return admit_embedding(w);  // pooled over fresh hidden states: no stored prefix to wait for
  if (tiers_ && tiers_->store_enabled()) {
    auto hashes = kv::full_block_hashes(w.prompt, pool_.layout().block_size);
    if (!tiers_->prefetch(hashes, pool_)) {
      staged_.push_back({w, prefill_only, std::move(hashes)});
      return;
    }
  }
  admit(w, prefill_only);
}

void WorkerCore::admit(const WireRequest& w, bool prefill_only) {
  runtime::EngineRequest r{w.id, w.prompt, w.params, w.rng_key, prefill_only};
  try {
    engine_.add(std::move(r));
    if (w.stream && !prefill_only) streaming_.insert(w.id);
  } catch (const Error& e) {
    refuse(w.id, e.what());
  }
}

void WorkerCore::admit_embedding(const WireRequest& w) {
  if (w.inputs.empty() || w.inputs.size() >= (std::size_t{1} << 23)) return refuse(w.id, "an embedding needs 1 to 8M inputs");
  std::vector<runtime::EngineRequest> subs;
  for (std::size_t j = 0; j < w.inputs.size(); ++j) {
    runtime::EngineRequest r{sub_id(w.id, j), w.inputs[j], w.params, w.rng_key, false};
    r.pooling = static_cast<runtime::Pooling>(w.pooling);
    try {
      engine_.check(r);
    } catch (const Error& e) {
      const std::string engine_name = "request " + std::to_string(r.id) + ": ";
      const std::string why = std::string(e.what()).rfind(engine_name, 0) == 0 ? std::string(e.what()).substr(engine_name.size())
                                                                                 : std::string(e.what());
      return refuse(w.id, w.inputs.size() == 1 ? why : "input " + std::to_string(j) + ": " + why);
    }
    subs.push_back(std::move(r));
  }
  Embedding& e = embeddings_[w.id];
  e.vectors.resize(subs.size());
  e.left = static_cast<int64_t>(subs.size());
  for (auto& r : subs) engine_.add(std::move(r));
}

bool WorkerCore::gather_embedding(runtime::EngineOutput& o, std::vector<WireResult>& results) {
  if (o.id == line_of(o.id)) return false;
  auto it = embeddings_.find(line_of(o.id));
  if (it == embeddings_.end()) return true;  // its line was aborted and reported
  Embedding& e = it->second;
  const std::size_t j = static_cast<std::size_t>(o.id >> 40) - 1;
  e.aborted = e.aborted || o.reason == runtime::FinishReason::kAbort;
  e.vectors[j] = std::move(o.embedding);
  e.prompt_tokens += o.prompt_tokens;
  e.computed += o.prompt_tokens_computed;
  e.ttft_s = std::max(e.ttft_s, o.ttft_s);
  e.e2e_s = std::max(e.e2e_s, o.e2e_s);
  if (--e.left > 0) return true;
  WireResult r;
  r.id = it->first;
  r.worker = rank_;
  r.finish_reason = e.aborted ? "abort" : "stop";
  r.ttft_s = e.ttft_s;
  r.e2e_s = e.e2e_s;
  r.prompt_tokens_computed = e.computed;
  if (!e.aborted)
    for (const auto& v : e.vectors) r.embedding.insert(r.embedding.end(), v.begin(), v.end());
  results.push_back(std::move(r));
  embeddings_.erase(it);
  return true;
}

bool WorkerCore::fits(const WireRequest& w) {
  try {
    engine_.check(runtime::EngineRequest{w.id, w.prompt, w.params, w.rng_key, false});
    return true;
  } catch (const Error& e) {
    refuse(w.id, e.what());
    return false;
  }
}

void WorkerCore::refuse(uint64_t id, const std::string& why) {
  WireResult res;
  res.id = id;
  res.ok = false;
  res.error = why;
  res.worker = rank_;
  refused_.push_back(std::move(res));
}

void WorkerCore::poll_tiers() {
  if (!tiers_) return;
  std::vector<std::string> warnings;
  tiers_->poll(warnings);
  for (const auto& w : warnings) spdlog::warn("{}", w);
  // Requests whose stored prefix has come up to host memory go on (in arrival order).
  while (!staged_.empty() && !tiers_->reading(staged_.front().hashes)) {
    admit(staged_.front().request, staged_.front().prefill_only);
    staged_.pop_front();
  }
}

bool WorkerCore::prefix_ready(std::span<const int32_t> prompt) {
  if (!tiers_ || !tiers_->store_enabled()) return true;
  poll_tiers();
  return tiers_->prefetch(kv::full_block_hashes(prompt, pool_.layout().block_size), pool_);
}

void WorkerCore::close_tiers() {
  if (!tiers_) return;
  std::vector<std::string> warnings;
  tiers_->close(warnings);
  for (const auto& w : warnings) spdlog::warn("{}", w);
}

WorkerCore::StepOutput WorkerCore::step() {
  StepOutput out;
  poll_tiers();
  out.results = std::move(refused_);
  refused_.clear();
  out.deltas.deltas = std::move(first_tokens_);
  first_tokens_.clear();
  out.progress = !out.results.empty() || !out.deltas.deltas.empty();
  if (!engine_.has_work()) return out;
  out.progress = true;
  const auto t0 = std::chrono::steady_clock::now();
  auto outputs = engine_.step();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  busy_s_ += dt;
  const auto& shape = engine_.last_step();
  if (shape.prefill_tokens + shape.decode_seqs > 0) {
    samples_.push_back({shape, dt});
    if (samples_.size() > 512) samples_.pop_front();
  }
  for (auto& o : outputs) {
    if (!o.finished) {
      if (!o.new_tokens.empty() && streaming_.count(o.id)) out.deltas.deltas.push_back({o.id, std::move(o.new_tokens)});
      continue;
    }
    streaming_.erase(o.id);
    if (gather_embedding(o, out.results)) continue;
    if (o.reason == runtime::FinishReason::kPrefilled) {
      Handoff h;
      h.id = o.id;
      h.kv_blocks = std::move(o.kv_blocks);
      h.ready.id = o.id;
      h.ready.handoff.first_token = o.tokens.at(0);
      h.ready.handoff.logprobs = std::move(o.logprobs);
      h.ready.handoff.prompt_logprobs = std::move(o.prompt_logprobs);
      h.ready.prompt_tokens_computed = o.prompt_tokens_computed;
      out.handoffs.push_back(std::move(h));
      continue;
    }
    WireResult r;
    r.id = o.id;
    r.tokens = std::move(o.tokens);
    r.text = std::move(o.text);
    r.finish_reason = std::string(runtime::finish_reason_name(o.reason));
    r.logprobs = std::move(o.logprobs);
    r.prompt_logprobs = std::move(o.prompt_logprobs);
    r.ttft_s = o.ttft_s;
    r.e2e_s = o.e2e_s;
    r.prompt_tokens_computed = o.prompt_tokens_computed;
    if (auto it = remote_.find(o.id); it != remote_.end()) {
      r.prompt_tokens_computed += it->second.first;
      r.kv_blocks_moved = it->second.second;
      remote_.erase(it);
    }
    r.worker = rank_;
    out.results.push_back(std::move(r));
  }
  // A request that finished in this step streams nothing more: its result
  // carries the text, cut at a stop string the last tokens may have completed.
  if (!out.results.empty() && !out.deltas.deltas.empty()) {
    std::unordered_set<uint64_t> ended;
    for (const auto& r : out.results) ended.insert(r.id);
    std::erase_if(out.deltas.deltas, [&](const WireDeltas::Delta& d) { return ended.count(d.id) > 0; });
  }
  return out;
}

std::vector<runtime::StepSample> WorkerCore::take_step_samples() {
  std::vector<runtime::StepSample> out(samples_.begin(), samples_.end());
  samples_.clear();
  return out;
}

void WorkerCore::cancel(uint64_t id) {
  if (auto e = embeddings_.find(id); e != embeddings_.end()) {  // each input; the line's result comes when all are out
    for (std::size_t j = 0; j < e->second.vectors.size(); ++j) engine_.cancel(sub_id(id, j));
    return;
  }
  auto it = std::find_if(staged_.begin(), staged_.end(), [id](const Staged& st) { return st.request.id == id; });
  if (it == staged_.end()) return engine_.cancel(id);
  staged_.erase(it);
  abort_outside(id);
}

void WorkerCore::abort_outside(uint64_t id) {
  WireResult r;
  r.id = id;
  r.finish_reason = "abort";
  r.worker = rank_;
  refused_.push_back(std::move(r));
}

bool WorkerCore::drain_cache_events(WireCacheEvents& events) {
  events.rank = rank_;
  pool_.drain_events(events.stored, events.removed);
  if (tiers_) {
    tiers_->drain_events(events.host_stored, events.host_removed, events.disk_stored);
    if (store_index_pending_) {
      const auto all = tiers_->store_index();
      events.disk_stored.insert(events.disk_stored.end(), all.begin(), all.end());
      store_index_pending_ = false;
    }
  }
  return !events.stored.empty() || !events.removed.empty() || !events.host_stored.empty() ||
         !events.host_removed.empty() || !events.disk_stored.empty();
}

std::vector<int32_t> WorkerCore::cached_prefix(std::span<const int32_t> prompt) {
  return pool_.lookup(kv::full_block_hashes(prompt, pool_.layout().block_size));
}

void WorkerCore::add_prefilled(const WireRequest& w, std::vector<int32_t> blocks, const WireKvReady& ready,
                               std::chrono::steady_clock::time_point arrival, int64_t kv_blocks_moved) {
  runtime::EngineRequest r{w.id, w.prompt, w.params, w.rng_key, false};
  remote_[w.id] = {ready.prompt_tokens_computed, kv_blocks_moved};
  engine_.add_prefilled(std::move(r), std::move(blocks), ready.handoff, arrival);
  if (w.stream) {  // its first token was sampled on the prefill rank: stream it from here
    streaming_.insert(w.id);
    first_tokens_.push_back({w.id, {ready.handoff.first_token}});
  }
}

RankReport WorkerCore::report() const {
  RankReport r;
  r.rank = rank_;
  r.role = role_;
  r.tp = group_width_;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  r.busy_fraction = wall > 0 ? busy_s_ / wall : 0;
  r.prefill_tokens = engine_.stats().prefill_tokens;
  r.decode_tokens = engine_.stats().decode_tokens;
  r.preemptions = engine_.stats().preemptions;
  r.prefix_hit_tokens = engine_.stats().prefix_hit_tokens;
  r.kv_bytes_sent = kv_bytes_;
  r.kv_send_seconds = kv_seconds_;
  for (const auto& [dest, to] : kv_to_) r.kv_sent_to.push_back({dest, to.first, to.second});
  r.kv_wait_seconds = kv_wait_s_;
  r.kv_blocks_total = pool_.capacity();
  r.kv_blocks_used = pool_.capacity() - pool_.num_free();
  r.hit_tokens_by_tier = engine_.stats().hit_tokens_by_tier;
  r.experts = config_experts_;
  r.expert_tokens = engine_.backend().expert_tokens();
  r.expert_ranks = engine_.backend().expert_ranks();
  if (tiers_) r.tiers = tiers_->stats();
  if (tiers_base_)  // counters only: what the store held at open, the flags and the capacity are this worker's too
    kv::TierStats::each_field([&](std::string_view name, auto member) {
      if constexpr (!std::is_same_v<std::remove_reference_t<decltype(r.tiers.*member)>, bool>)
        if (!name.starts_with("store_") && name != "host_capacity_blocks") r.tiers.*member -= (*tiers_base_).*member;
    });
  return r;
}

void WorkerCore::count_tiers_from_now() {
  if (tiers_) tiers_base_ = tiers_->stats();
}

}  // namespace tandem::service
