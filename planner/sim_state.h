// The simulator's state between events (planner/simulator.cpp's own): the
// requests, the workers and the cells they form, the event queue, and the
// router's and the engines' rules as they act on them. Copyable: the oracle
// runs copies ahead. Not for other files.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "planner/simulator.h"
#include "router/kv_aware_policy.h"
#include "router/placement.h"

namespace tandem::planner {

// kIdle: a worker of the form its cell does not run now (its GPUs serve the other form).
enum class Role : uint8_t { kAgg, kPrefill, kDecode, kIdle };

struct ReqState {
  double dispatched = -1, first_token = -1, finished = -1;
  int32_t decode_worker = -1;
  int32_t prefill_worker = -1;  // -1: prefilled on its decode worker
  int64_t cached = 0;           // prompt tokens its prefilling worker had cached
};

struct WorkerState {
  const PerfModel* pm = nullptr;
  int32_t cell = 0;
  double kv_cap = 0;
  Role role = Role::kAgg, next_role = Role::kAgg;
  bool draining = false;
  bool busy = false;
  // Decode / agg side.
  std::deque<int32_t> reserve_q;   // routed here, waiting for a slot and KV
  int64_t reserved = 0;            // sequences holding a slot (prefilling, travelling, running)
  double kv_used = 0;              // tokens reserved
  int64_t n_running = 0;
  double ctx_sum = 0;
  int64_t step_no = 0;
  std::priority_queue<std::pair<int64_t, int32_t>, std::vector<std::pair<int64_t, int32_t>>, std::greater<>> finish;
  std::vector<int32_t> joining;    // first token arrived during a step: decode from the next one
  // Prefill (any role that prefills): prompts in order, the head partly done.
  std::deque<int32_t> prefill_q;
  int64_t head_done = 0;
  double queued_prefill_tokens = 0;
  int64_t in_transit = 0;          // prefilled elsewhere, KV on the way here
  // Router's view.
  int64_t load = 0;
  int64_t active_blocks = 0;
  std::vector<int32_t> cached_groups;  // prefix groups whose blocks are cached here
  // The step in progress.
  int64_t step_decoders = 0;
  std::vector<std::pair<int32_t, int64_t>> step_chunks;  // (prompt, tokens) in queue order

  bool holds_work() const {
    return !reserve_q.empty() || reserved > 0 || !prefill_q.empty() || in_transit > 0 || busy;
  }
  bool has_cached(int32_t g) const {
    return g >= 0 && std::find(cached_groups.begin(), cached_groups.end(), g) != cached_groups.end();
  }
  void cache(int32_t g) {
    if (g >= 0 && !has_cached(g)) cached_groups.push_back(g);
  }
};

// A cell of two forms (prefill workers of one width, decode workers of
// another) runs one form at a time; the other's workers are idle.
struct CellState {
  std::vector<int32_t> prefill, decode;  // its workers in each form (the same list: one form)
  bool on_prefill = false;  // the form it runs (two forms)
  // A switch: its workers drain, then (loading) the other form's workers copy
  // their weights in and start with role `target`.
  bool switching = false, loading = false;
  Role target = Role::kAgg;
  bool one_form() const { return prefill == decode; }
  const std::vector<int32_t>& running() const { return on_prefill ? prefill : decode; }
  const std::vector<int32_t>& other() const { return on_prefill ? decode : prefill; }
};

// Whether a finished request met both targets (all do when there are none).
inline bool meets_targets(const SimOptions& o, const Request& q, const ReqState& r) {
  const double itl = q.osl > 1 ? (r.finished - r.first_token) / static_cast<double>(q.osl - 1) : 0;
  return (o.ttft_target_s <= 0 || r.first_token - q.arrival_s <= o.ttft_target_s) &&
         (o.itl_target_s <= 0 || itl <= o.itl_target_s);
}

struct Event {
  double t;
  uint64_t seq;
  int32_t worker;  // a cell, for kCellReady
  int32_t req;  // kStepEnd: the worker's step ends; kCellReady: the cell's new workers start; else req's KV lands
  static constexpr int32_t kStepEnd = -1, kCellReady = -2;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

// The whole state of a run (copyable: the oracle runs copies ahead).
struct SimState {
  const SimOptions* o = nullptr;
  const std::vector<Request>* reqs = nullptr;
  std::vector<ReqState> rs;
  std::vector<WorkerState> w;
  std::vector<CellState> cells;
  std::vector<int32_t> by_speed;  // cells, fastest (peak_flops) first: prefill roles go there
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  uint64_t seq = 0;
  double now = 0;
  int64_t next_dispatch = 0;  // the next request to place
  int64_t in_flight = 0;
  int64_t finished = 0;
  int64_t finished_missed = 0;  // finished requests that missed a target (bounds the oracle's goodput)
  double output_tokens_done = 0;
  uint64_t turn = 0;
  Split split;
  std::vector<EpochRecord> epochs;
  std::vector<int64_t> epoch_left;  // requests of each epoch not finished
  std::vector<SimResult::Sample> timeline;
  double sample_every = 0.5, next_sample = 0, last_sample_tokens = 0;
  std::vector<int32_t> touched;  // workers to try starting a step on
  // Scratch, kept to spare an allocation per event: the batch of touched
  // workers being handled, the router's candidates, and the count of workers
  // taking decode work (-1: roles changed since it was counted).
  std::vector<int32_t> touched_batch;
  std::vector<router::Candidate> cands, pre_cands;
  std::vector<int32_t> cand_ids, pre_ids;
  router::PlacementOptions placement;  // the job's, from SimOptions
  std::vector<std::pair<int32_t, int32_t>> placements;  // recorded when asked
  int64_t n_decode_takers = -1;

  int64_t epoch_of(int64_t i) const { return i / o->epoch_requests; }
  const Request& req(int32_t i) const { return (*reqs)[static_cast<std::size_t>(i)]; }
  ReqState& st(int32_t i) { return rs[static_cast<std::size_t>(i)]; }
  WorkerState& wk(int32_t k) { return w[static_cast<std::size_t>(k)]; }
  void push(double t, int32_t worker, int32_t r) { events.push({t, seq++, worker, r}); }

  // The split of an epoch; the first one (`start`) is the job's layout at
  // start-up: every cell forms as it asks, with no drain and no reload.
  void apply_split(const Split& s, bool start) {
    split = s;
    const auto n = static_cast<int64_t>(cells.size());
    for (int64_t k = 0; k < n; ++k) {
      const int32_t id = by_speed[static_cast<std::size_t>(k)];
      CellState& c = cells[static_cast<std::size_t>(id)];
      const Role r = s.agg() ? Role::kAgg : (k < s.prefill ? Role::kPrefill : Role::kDecode);
      if (c.one_form()) {
        set_role(c.decode.front(), r);
        continue;
      }
      const bool want_prefill = r == Role::kPrefill;
      if (start) {
        c.on_prefill = want_prefill;
        for (int32_t k2 : c.other()) wk(k2).role = Role::kIdle;
        for (int32_t k2 : c.running()) wk(k2).role = r;
        n_decode_takers = -1;
        continue;
      }
      if (c.loading) {  // its new form starts first (and drains at once, if it is not the one wanted now)
        c.target = r;
        continue;
      }
      if (c.switching && want_prefill != c.on_prefill) {  // on its way to that form already
        c.target = r;
        continue;
      }
      if (want_prefill == c.on_prefill) {  // the form it runs: decode <-> agg at once; a switch under way is called off
        c.switching = false;
        for (int32_t k2 : c.running()) {
          WorkerState& ws = wk(k2);
          ws.role = r;
          ws.draining = false;
          touched.push_back(k2);
        }
        n_decode_takers = -1;
        continue;
      }
      switch_form(id, r);
    }
  }

  // The other form: the cell's workers finish what they hold, then its GPUs regroup.
  void switch_form(int32_t cell, Role r) {
    CellState& c = cells[static_cast<std::size_t>(cell)];
    c.switching = true;
    c.target = r;
    for (int32_t k : c.running()) {
      WorkerState& ws = wk(k);
      ws.next_role = Role::kIdle;
      ws.draining = true;
    }
    n_decode_takers = -1;
    for (int32_t k : c.running()) maybe_switch(k);
  }

  // A one-form worker takes role r: only a move into or out of prefill-only
  // drains (a decode worker must finish its sequences, a prefill worker its
  // queue); agg <-> decode is a change of what the router sends, at once.
  void set_role(int32_t id, Role r) {
    WorkerState& ws = wk(id);
    if (r == (ws.draining ? ws.next_role : ws.role)) return;
    if (r == ws.role || (r != Role::kPrefill && ws.role != Role::kPrefill)) {
      ws.role = r;
      ws.draining = false;
      n_decode_takers = -1;
      touched.push_back(id);
      return;
    }
    ws.next_role = r;
    ws.draining = true;
    n_decode_takers = -1;
    maybe_switch(id);
  }

  void maybe_switch(int32_t k) {
    WorkerState& ws = wk(k);
    if (!ws.draining || ws.holds_work()) return;
    ws.role = ws.next_role;
    ws.draining = false;
    n_decode_takers = -1;
    touched.push_back(k);
    if (ws.role == Role::kIdle) regroup(ws.cell);
  }

  // A switching cell whose workers have all drained regroups its GPUs into
  // the other form: its workers start once they have copied their weights in.
  void regroup(int32_t cell) {
    CellState& c = cells[static_cast<std::size_t>(cell)];
    if (!c.switching || c.loading) return;
    for (int32_t k : c.running())
      if (wk(k).role != Role::kIdle || wk(k).draining) return;
    c.on_prefill = !c.on_prefill;
    c.loading = true;
    double load = 0;
    for (int32_t k : c.running()) load = std::max(load, wk(k).pm->reload_seconds());
    push(now + load, cell, Event::kCellReady);
  }

  void cell_ready(int32_t cell) {
    CellState& c = cells[static_cast<std::size_t>(cell)];
    c.switching = c.loading = false;
    const Role r = c.target;
    for (int32_t k : c.running()) {
      wk(k).role = (r == Role::kPrefill) == c.on_prefill ? r : (c.on_prefill ? Role::kPrefill : Role::kAgg);
      touched.push_back(k);
    }
    n_decode_takers = -1;
    // A re-split while it loaded asked for the form it left: switch back (nothing to drain).
    if ((r == Role::kPrefill) != c.on_prefill) switch_form(cell, r);
  }

  bool takes_decode(const WorkerState& ws) const {
    return !ws.draining && ws.role != Role::kPrefill && ws.role != Role::kIdle;
  }
  bool takes_prefill(const WorkerState& ws) const { return !ws.draining && ws.role == Role::kPrefill; }

  int64_t decode_workers() {
    if (n_decode_takers < 0) {
      n_decode_takers = 0;
      for (const auto& ws : w) n_decode_takers += takes_decode(ws) ? 1 : 0;
    }
    return n_decode_takers;
  }

  // The router: place arrived requests while the window has room.
  template <class OnEpoch>
  void dispatch(OnEpoch&& on_epoch) {
    const auto n_req = static_cast<int64_t>(reqs->size());
    while (next_dispatch < n_req) {
      const Request& r = req(static_cast<int32_t>(next_dispatch));
      if (r.arrival_s > now) break;
      if (next_dispatch % o->epoch_requests == 0 &&
          static_cast<int64_t>(epochs.size()) <= epoch_of(next_dispatch))
        on_epoch(epoch_of(next_dispatch));
      if (in_flight >= 2 * o->max_num_seqs * std::max<int64_t>(1, decode_workers())) break;
      const int64_t blocks = (r.isl + o->block_size - 1) / o->block_size;
      // The job's placement (router::place) over this state: decode-capable
      // workers with their cached overlap and load, prefill-only workers
      // with theirs and their queues.
      cands.clear();
      cand_ids.clear();
      pre_cands.clear();
      pre_ids.clear();
      for (std::size_t k = 0; k < w.size(); ++k) {
        const WorkerState& ws = w[k];
        const int64_t overlap = ws.has_cached(r.prefix_group) ? r.prefix_tokens / o->block_size : 0;
        if (takes_decode(ws)) {
          cands.push_back({static_cast<int>(k), overlap, ws.active_blocks, ws.load, 0});
          cand_ids.push_back(static_cast<int32_t>(k));
        } else if (takes_prefill(ws)) {
          pre_cands.push_back({static_cast<int>(k), overlap, 0, 0, static_cast<int64_t>(ws.queued_prefill_tokens)});
          pre_ids.push_back(static_cast<int32_t>(k));
        }
      }
      if (cands.empty()) break;  // every decode-capable worker is switching roles: wait for one
      const router::PlacementChoice pick = router::place(r.isl, cands, pre_cands, placement, turn++);
      const int32_t d = cand_ids[pick.worker];
      const auto i = static_cast<int32_t>(next_dispatch++);
      ReqState& s = st(i);
      s.dispatched = now;
      s.decode_worker = d;
      WorkerState& dw = wk(d);
      ++dw.load;
      dw.active_blocks += blocks;
      if (epochs[static_cast<std::size_t>(epoch_of(i))].start_s < 0) epochs[static_cast<std::size_t>(epoch_of(i))].start_s = now;
      s.prefill_worker = pick.prefill >= 0 ? pre_ids[static_cast<std::size_t>(pick.prefill)] : -1;
      if (s.prefill_worker >= 0) wk(s.prefill_worker).queued_prefill_tokens += static_cast<double>(r.isl);  // counted now, as the router does
      if (o->record_placements) placements.emplace_back(d, s.prefill_worker);
      dw.reserve_q.push_back(i);
      ++in_flight;
      admit(d);
    }
  }

  // A decode/agg worker reserves a slot and KV for what was routed to it, in order.
  void admit(int32_t d) {
    WorkerState& dw = wk(d);
    while (!dw.reserve_q.empty()) {
      const int32_t i = dw.reserve_q.front();
      const Request& r = req(i);
      const double need = static_cast<double>(r.isl + r.osl);
      if (dw.reserved >= o->max_num_seqs || (dw.kv_used + need > dw.kv_cap && dw.reserved > 0)) break;
      dw.reserve_q.pop_front();
      ++dw.reserved;
      dw.kv_used += need;
      ReqState& s = st(i);
      if (s.prefill_worker >= 0) {  // the router's provisional count becomes the real one, or goes
        wk(s.prefill_worker).queued_prefill_tokens -= static_cast<double>(r.isl);
        if (wk(s.prefill_worker).role != Role::kPrefill) s.prefill_worker = -1;  // it changed roles meanwhile
      }
      if (s.prefill_worker >= 0) {
        WorkerState& pw = wk(s.prefill_worker);
        s.cached = pw.has_cached(r.prefix_group) ? r.prefix_tokens : 0;
        pw.prefill_q.push_back(i);
        pw.queued_prefill_tokens += static_cast<double>(r.isl - s.cached);
        ++dw.in_transit;
        touched.push_back(s.prefill_worker);
      } else {
        s.cached = dw.has_cached(r.prefix_group) ? r.prefix_tokens : 0;
        dw.prefill_q.push_back(i);
        dw.queued_prefill_tokens += static_cast<double>(r.isl - s.cached);
        touched.push_back(d);
      }
    }
  }

  // Starts a step on an idle worker with work: every running sequence decodes
  // one token; prompts in queue order fill the rest of the token budget.
  void start_step(int32_t k) {
    WorkerState& ws = wk(k);
    if (ws.busy) return;
    StepLoad load;
    const bool decodes = ws.role != Role::kPrefill;
    ws.step_decoders = decodes ? ws.n_running : 0;
    load.decode_seqs = static_cast<double>(ws.step_decoders);
    load.decode_ctx = decodes ? ws.ctx_sum : 0;
    load.logit_rows = load.decode_seqs;
    int64_t budget = o->max_batched_tokens - ws.step_decoders;
    ws.step_chunks.clear();
    for (std::size_t q = 0; q < ws.prefill_q.size() && budget > 0; ++q) {
      const int32_t i = ws.prefill_q[q];
      const Request& r = req(i);
      const int64_t start = st(i).cached + (q == 0 ? ws.head_done : 0);
      const int64_t take = std::min(budget, r.isl - start);
      load.prefill_tokens += static_cast<double>(take);
      // Each prompt token attends to every position up to its own.
      load.prefill_ctx += static_cast<double>(take) * (static_cast<double>(start) + static_cast<double>(take + 1) / 2.0);
      budget -= take;
      ws.step_chunks.emplace_back(i, take);
      if (start + take >= r.isl) load.logit_rows += 1;
    }
    if (load.prefill_tokens == 0 && load.decode_seqs == 0) return;
    ws.busy = true;
    push(now + ws.pm->step_seconds(load), k, Event::kStepEnd);
  }

  void sequence_ends(int32_t d, int32_t i) {
    WorkerState& dw = wk(d);
    const Request& r = req(i);
    st(i).finished = now;
    if (!meets_targets(*o, r, st(i))) ++finished_missed;
    --dw.reserved;
    dw.kv_used -= static_cast<double>(r.isl + r.osl);
    --dw.load;
    dw.active_blocks -= (r.isl + o->block_size - 1) / o->block_size;
    --in_flight;
    ++finished;
    output_tokens_done += static_cast<double>(r.osl);
    const auto e = static_cast<std::size_t>(epoch_of(i));
    if (--epoch_left[e] == 0) epochs[e].end_s = now;
    touched.push_back(d);  // a slot is free: admit
  }

  // A sequence with its first token joins the decoding set of worker d.
  void join(int32_t d, int32_t i) {
    WorkerState& dw = wk(d);
    const Request& r = req(i);
    dw.cache(r.prefix_group);
    if (r.osl <= 1) return sequence_ends(d, i);
    ++dw.n_running;
    dw.ctx_sum += static_cast<double>(r.isl + 1);
    dw.finish.push({dw.step_no + r.osl - 1, i});
  }

  void step_end(int32_t k) {
    WorkerState& ws = wk(k);
    ws.busy = false;
    if (ws.step_decoders > 0) {
      ++ws.step_no;
      ws.ctx_sum += static_cast<double>(ws.step_decoders);
      while (!ws.finish.empty() && ws.finish.top().first <= ws.step_no) {
        const int32_t i = ws.finish.top().second;
        ws.finish.pop();
        --ws.n_running;
        ws.ctx_sum -= static_cast<double>(req(i).isl + req(i).osl);
        sequence_ends(k, i);
      }
    }
    for (int32_t i : ws.joining) join(k, i);
    ws.joining.clear();
    for (const auto& [i, take] : ws.step_chunks) {
      const Request& r = req(i);
      ReqState& s = st(i);
      const bool head = ws.prefill_q.front() == i;
      const int64_t start = s.cached + (head ? ws.head_done : 0);
      if (start + take < r.isl) {  // only the head can be partial, and it is last
        ws.head_done += take;
        ws.queued_prefill_tokens -= static_cast<double>(take);
        break;
      }
      ws.prefill_q.pop_front();
      ws.queued_prefill_tokens -= static_cast<double>(take);
      ws.head_done = 0;
      s.first_token = now;
      if (ws.role == Role::kPrefill && s.prefill_worker == k) {
        ws.cache(r.prefix_group);
        const bool decode_has = wk(s.decode_worker).has_cached(r.prefix_group);
        const double moved = static_cast<double>(r.isl - (decode_has ? r.prefix_tokens : 0));
        push(now + ws.pm->transfer_seconds(moved), s.decode_worker, i);
      } else {
        join(k, i);
      }
    }
    ws.step_chunks.clear();
    ws.step_decoders = 0;
    touched.push_back(k);
  }

  void kv_lands(int32_t d, int32_t i) {
    WorkerState& dw = wk(d);
    --dw.in_transit;
    st(i).first_token = now;  // the client sees its first token once the decode worker has the KV
    if (dw.busy) dw.joining.push_back(i);
    else join(d, i);
    touched.push_back(d);
  }

  void sample(bool force) {
    if (!force && now < next_sample) return;
    SimResult::Sample s;
    s.t = now;
    for (const auto& ws : w) {
      const Role r = ws.role;
      if (r != Role::kIdle) (r == Role::kPrefill ? s.prefill : r == Role::kDecode ? s.decode : s.agg) += 1;
    }
    const double dt = timeline.empty() ? now : now - timeline.back().t;
    if (dt < sample_every / 4 && !timeline.empty()) {  // too short a window for a rate (a forced sample): keep the last
      s.output_tokens_per_s = timeline.back().output_tokens_per_s;
    } else {
      s.output_tokens_per_s = dt > 0 ? (output_tokens_done - last_sample_tokens) / dt : 0;
      last_sample_tokens = output_tokens_done;
    }
    timeline.push_back(s);
    if (timeline.size() > 4000) {  // keep it small: double the interval, drop every other sample
      std::vector<SimResult::Sample> kept;
      for (std::size_t j = 0; j < timeline.size(); j += 2) kept.push_back(timeline[j]);
      timeline.swap(kept);
      sample_every *= 2;
    }
    next_sample = now + sample_every;
  }

  // Runs events until every request has finished, or stop() says so.
  template <class OnEpoch, class Stop>
  void run(OnEpoch&& on_epoch, Stop&& stop) {
    const auto n_req = static_cast<int64_t>(reqs->size());
    for (;;) {
      dispatch(on_epoch);
      while (!touched.empty()) {
        std::vector<int32_t>& t = touched_batch;
        t.swap(touched);
        touched.clear();
        std::sort(t.begin(), t.end());
        t.erase(std::unique(t.begin(), t.end()), t.end());
        for (int32_t k : t) {
          if (wk(k).role != Role::kPrefill) admit(k);
        }
        for (int32_t k : t) start_step(k);
        for (int32_t k : t) maybe_switch(k);
        if (!touched.empty()) dispatch(on_epoch);  // a switched worker may take requests now
      }
      if (finished == n_req || stop()) return;
      if (events.empty()) {
        // Nothing running: the next request arrives later (Poisson), or the router waits on draining workers.
        if (next_dispatch < n_req && req(static_cast<int32_t>(next_dispatch)).arrival_s > now) {
          now = req(static_cast<int32_t>(next_dispatch)).arrival_s;
          continue;
        }
        throw Error("internal: the simulation stalled with " + std::to_string(n_req - finished) +
                    " request(s) unfinished");
      }
      const Event e = events.top();
      // Arrivals between now and the next event are placed when they come.
      if (next_dispatch < n_req && req(static_cast<int32_t>(next_dispatch)).arrival_s < e.t &&
          req(static_cast<int32_t>(next_dispatch)).arrival_s > now) {
        now = req(static_cast<int32_t>(next_dispatch)).arrival_s;
        continue;
      }
      events.pop();
      now = e.t;
      if (e.req == Event::kStepEnd) step_end(e.worker);
      else if (e.req == Event::kCellReady) cell_ready(e.worker);
      else kv_lands(e.worker, e.req);
      sample(false);
    }
  }
};

}  // namespace tandem::planner
