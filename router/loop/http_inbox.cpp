#include "router/loop/http_inbox.h"

#include <spdlog/spdlog.h>

namespace tandem::router {

void Exchange::post(ExchangeEvent e) {
  {
    std::lock_guard lock(mu);
    events.push_back(std::move(e));
  }
  cv.notify_all();
  if (notify) notify();
}

void Inbox::post(std::shared_ptr<Exchange> e) {
  std::lock_guard lock(mu_);
  fresh_.push_back(std::move(e));
}

void Inbox::cancel(std::shared_ptr<Exchange> e) {
  std::lock_guard lock(mu_);
  cancelled_.push_back(std::move(e));
}

void Inbox::take(std::vector<std::shared_ptr<Exchange>>& fresh, std::vector<std::shared_ptr<Exchange>>& cancelled) {
  std::lock_guard lock(mu_);
  fresh.assign(fresh_.begin(), fresh_.end());
  cancelled.assign(cancelled_.begin(), cancelled_.end());
  fresh_.clear();
  cancelled_.clear();
}

std::size_t Inbox::waiting() {
  std::lock_guard lock(mu_);
  return fresh_.size();
}

void HttpInboxFrontend::workers_loaded(std::size_t loaded, std::size_t want) {
  (void)want;
  inbox_.workers_loaded = static_cast<int64_t>(loaded);
  metrics_.set_workers_loaded(static_cast<int64_t>(loaded), s_.workers);
  if (!announced_ && static_cast<int64_t>(loaded) >= s_.workers) {
    announced_ = true;
    spdlog::info("all {} worker(s) loaded: /health is 200", s_.workers);
  }
}

// Every choice of every new request, placed at once: the HTTP layer bounds
// what is in flight (http.max_in_flight, 429 past it).
void HttpInboxFrontend::admit(RouterLoop& loop) {
  inbox_.take(fresh_, cancelled_);
  for (auto& ex : fresh_) {
    if (ex->cancelled) {  // gone before it was placed
      for (int64_t c = 0; c < ex->req.n; ++c) ex->post(ExchangeEvent{static_cast<int>(c), {}, service::WireResult{}});
      continue;
    }
    for (int64_t c = 0; c < ex->req.n; ++c) {
      service::WireRequest w;
      w.id = next_id_++;
      if (ex->req.endpoint == Endpoint::kEmbeddings) {  // its inputs, each pooled on its own
        w.pooling = s_.pooling;
        w.inputs = ex->req.input_ids;
      } else {
        w.prompt = ex->prompt;
      }
      w.params = ex->req.params;
      // Choice 0 samples as `tandem run` would for the same request; the others on keys of their own.
      w.rng_key = sampling_key(ex->req.seed_given, ex->req.params.seed, s_.job_seed, ex->req.custom_id);
      if (c > 0) w.rng_key = sampling_key(true, w.rng_key + static_cast<uint64_t>(c), 0, "");
      w.stream = ex->req.stream;
      ex->wire_ids.push_back(w.id);
      live_[w.id] = {ex, static_cast<int>(c)};
      if (s_.planner)
        epoch_requests_.push_back({static_cast<int64_t>(ex->prompt.size()),
                                   ex->req.endpoint == Endpoint::kEmbeddings ? 1 : w.params.max_tokens, 0, 0, -1});
      loop.place(std::move(w));
    }
  }
  fresh_.clear();
}

void HttpInboxFrontend::take_cancels(std::vector<uint64_t>& ids) {
  for (auto& ex : cancelled_)
    for (uint64_t id : ex->wire_ids)
      if (live_.count(id)) ids.push_back(id);
  cancelled_.clear();
}

void HttpInboxFrontend::on_delta(service::WireDeltas::Delta& d) {
  auto it = live_.find(d.id);
  if (it != live_.end()) it->second.ex->post(ExchangeEvent{it->second.choice, std::move(d.tokens), std::nullopt});
}

void HttpInboxFrontend::on_result(service::WireResult& r) {
  auto it = live_.find(r.id);
  if (it == live_.end()) return;
  const auto n = static_cast<double>(r.tokens.size());
  if (r.ok && r.finish_reason != "abort")
    metrics_.generation(r.ttft_s, n > 1 ? (r.e2e_s - r.ttft_s) / (n - 1) : 0.0, r.e2e_s,
                        static_cast<int64_t>(it->second.ex->prompt.size()), static_cast<int64_t>(r.tokens.size()),
                        r.prompt_tokens_computed);
  auto ex = it->second.ex;
  const int choice = it->second.choice;
  live_.erase(it);
  ex->post(ExchangeEvent{choice, {}, std::move(r)});
}

void HttpInboxFrontend::on_stats(const service::RankReport& r) {
  if (s_.planner) s_.planner->observe(r.step_samples, r.tp);
  metrics_.set_rank({r.rank, std::string(service::role_name(r.role)), r.kv_blocks_used, r.kv_blocks_total, r.kv_bytes_sent, r.prefix_hit_tokens,
                     r.hit_tokens_by_tier, r.tiers, r.experts, r.expert_tokens, r.expert_ranks});
}

// An epoch ends: a server cannot see ahead, so the next one is sized from the last.
void HttpInboxFrontend::tick(RouterLoop& loop) {
  metrics_.set_in_flight(static_cast<int64_t>(live_.size()), static_cast<int64_t>(inbox_.waiting()));
  if (!s_.planner || loop.draining()) return;
  if (std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count() < s_.epoch_seconds) return;
  if (!epoch_requests_.empty()) {
    const auto d = s_.planner->decide(epoch_requests_);
    if (d.changed()) {
      std::vector<int> prefill(s_.worker_ranks.begin(), s_.worker_ranks.begin() + d.split.prefill);
      loop.set_roles(d.epoch, prefill);
    }
    spdlog::info("{} (from the last {:g} s: {} requests)", d.describe(), s_.epoch_seconds, epoch_requests_.size());
    epoch_requests_.clear();
  }
  epoch_start_ = std::chrono::steady_clock::now();
}

void HttpInboxFrontend::drain_started(int signal, std::size_t in_flight) {
  inbox_.draining = true;  // new requests get 503
  spdlog::info("signal {}: no new requests; finishing {} in flight", signal, in_flight);
}

// Requests the HTTP threads accepted but the loop has not taken, or still answer.
bool HttpInboxFrontend::holds_requests() const { return inbox_.waiting() > 0 || inbox_.active.load() > 0; }

void HttpInboxFrontend::ended(std::vector<service::RankReport> reports, std::size_t abandoned) {
  (void)reports;
  if (abandoned > 0) spdlog::warn("{} request(s) still running were abandoned", abandoned);
  // Their HTTP threads are waiting: they answer now (an error, or the stream's end), so the server can stop.
  for (auto& [id, l] : live_) {
    service::WireResult gone;
    gone.id = id;
    gone.ok = false;
    gone.error = "the server stopped before this request finished";
    l.ex->post(ExchangeEvent{l.choice, {}, std::move(gone), true});
  }
  live_.clear();
  spdlog::info("server stopped");
}

}  // namespace tandem::router
