#include "planner/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace tandem::planner {
namespace {

struct Lengths {
  double n = 0, mean_isl = 0, mean_osl = 0, prompt_tokens = 0, output_tokens = 0, max_osl = 0;
};

Lengths lengths(std::span<const Request> rs) {
  Lengths l;
  l.n = static_cast<double>(rs.size());
  for (const auto& r : rs) {
    l.prompt_tokens += static_cast<double>(r.isl - (r.prefix_group >= 0 ? r.prefix_tokens : 0));
    l.output_tokens += static_cast<double>(r.osl);
    l.max_osl = std::max(l.max_osl, static_cast<double>(r.osl));
  }
  if (l.n > 0) {
    double isl = 0;
    for (const auto& r : rs) isl += static_cast<double>(r.isl);
    l.mean_isl = isl / l.n;
    l.mean_osl = l.output_tokens / l.n;
  }
  return l;
}

// Cells in the order roles are given: fastest first (prefill goes there).
std::vector<const Cell*> by_speed(const PlanContext& ctx) {
  std::vector<const Cell*> c;
  for (const Cell& cell : ctx.cells) c.push_back(&cell);
  std::stable_sort(c.begin(), c.end(), [](const Cell* a, const Cell* b) { return a->peak_flops() > b->peak_flops(); });
  return c;
}

// Sequences a worker runs at once for these lengths: slots, KV, and how many there are to run.
double concurrency(const PerfModel& pm, const SimOptions& o, const Lengths& l, double workers) {
  const double per_seq = std::max(1.0, l.mean_isl + l.mean_osl);
  return std::max(1.0, std::min({static_cast<double>(o.max_num_seqs), std::floor(pm.kv_capacity_tokens() / per_seq),
                                 std::ceil(l.n / std::max(1.0, workers))}));
}

// One prefill-only step of `tokens` prompt tokens of mean length isl.
double prefill_step(const PerfModel& pm, double tokens, double isl) {
  StepLoad s;
  s.prefill_tokens = tokens;
  s.prefill_ctx = tokens * std::min(isl, tokens) / 2.0 + tokens * std::max(0.0, isl - tokens) / 2.0;
  s.logit_rows = std::max(1.0, tokens / std::max(1.0, isl));
  return pm.step_seconds(s);
}

double decode_step(const PerfModel& pm, double seqs, double ctx, double prefill_tokens = 0, double isl = 1) {
  StepLoad s;
  s.decode_seqs = seqs;
  s.decode_ctx = seqs * ctx;
  s.logit_rows = seqs + (prefill_tokens > 0 ? std::max(1.0, prefill_tokens / std::max(1.0, isl)) : 0);
  s.prefill_tokens = prefill_tokens;
  s.prefill_ctx = prefill_tokens * isl / 2.0;
  return pm.step_seconds(s);
}

}  // namespace

std::vector<Split> all_splits(int64_t workers) {
  std::vector<Split> out{{0, workers}};
  for (int64_t p = 1; p < workers; ++p) out.push_back({p, workers - p});
  return out;
}

EpochEstimate estimate_epoch(std::span<const Request> requests, const Split& split, const PlanContext& ctx) {
  EpochEstimate est;
  if (requests.empty()) return est;
  const SimOptions& o = *ctx.options;
  const Lengths l = lengths(requests);
  const auto cells = by_speed(ctx);
  // Aggregated, every cell runs its decode form; disaggregated, the first split.prefill cells their prefill form.
  std::vector<const PerfModel*> models, prefill_models;
  for (std::size_t k = 0; k < cells.size(); ++k) {
    const bool prefill = !split.agg() && k < static_cast<std::size_t>(split.prefill);
    for (const PerfModel* pm : prefill ? cells[k]->prefill : cells[k]->decode) (prefill ? prefill_models : models).push_back(pm);
  }
  const double n_workers = static_cast<double>(models.size());
  const double B = static_cast<double>(o.max_batched_tokens);
  const double ctx_len = l.mean_isl + l.mean_osl / 2.0;
  // Requests that arrive over time (Poisson phases) cannot finish before they arrive;
  // and the pools then run only as full as the arrivals make them (Little's law).
  double first = requests.front().arrival_s, last = first;
  for (const auto& r : requests) first = std::min(first, r.arrival_s), last = std::max(last, r.arrival_s);
  const double span = last - first;
  const double rate = span > 0 ? l.n / span : 0;  // requests/s; 0: all at once
  if (split.agg()) {
    // Every worker decodes its b sequences each step; prompts arrive in
    // bursts as slots free (one prompt per step at a time, as Tandem's engine
    // schedules them), so a step with a prompt in it costs the prompt's
    // compute on top of the decode step, unless both fit under the memory time.
    double total = 0, itl = 0, ttft = 0;
    for (const PerfModel* pm : models) {
      double b = std::min(concurrency(*pm, o, l, n_workers), B - 1);
      const double chunk = std::max(1.0, std::min(B - b, l.prompt_tokens / std::max(1.0, l.n)));
      double plain = decode_step(*pm, b, ctx_len), mixed = decode_step(*pm, b, ctx_len, chunk, l.mean_isl);
      double step = 0;
      for (int it = 0; it < 8; ++it) {  // with arrivals, only as many run as arrive: b = rate * osl * step / workers
        const double decode_steps = l.output_tokens / (n_workers * b), prefill_steps = l.prompt_tokens / (n_workers * chunk);
        step = (decode_steps * plain + prefill_steps * (mixed - plain)) / decode_steps;
        if (rate <= 0) break;
        const double want = std::max(1.0, rate / n_workers * l.mean_osl * step);
        if (want >= b) break;
        b = want;
        plain = decode_step(*pm, b, ctx_len);
        mixed = decode_step(*pm, b, ctx_len, chunk, l.mean_isl);
      }
      const double decode_steps = l.output_tokens / (n_workers * b);
      const double prefill_steps = l.prompt_tokens / (n_workers * chunk);
      const double t = prefill_steps <= decode_steps
                           ? decode_steps * plain + prefill_steps * (mixed - plain)
                           : prefill_steps * mixed + l.mean_osl * plain;  // prompts are the bottleneck
      total += t;
      itl += step;
      ttft += mixed;
    }
    est.seconds = std::max(total / n_workers, span);
    est.itl_s = itl / n_workers;
    est.ttft_s = ttft / n_workers;
    est.overloaded = rate > 0 && total / n_workers > span * 1.05;
    return est;
  }
  // Disaggregated: prefill pool and decode pool work in a pipeline.
  double prefill_rate = 0, decode_rate = 0, decode_step_s = 0, first_prefill = 0;
  const double D = n_workers;
  for (const PerfModel* pm : prefill_models) {
    const double t = prefill_step(*pm, B, l.mean_isl);
    prefill_rate += B / t;
    first_prefill = std::max(first_prefill, prefill_step(*pm, std::min(B, l.mean_isl), l.mean_isl) +
                                                pm->transfer_seconds(l.mean_isl));
  }
  for (const PerfModel* pm : models) {
    double b = concurrency(*pm, o, l, D);
    double t = decode_step(*pm, b, ctx_len);
    for (int it = 0; it < 8 && rate > 0; ++it) {
      const double want = std::max(1.0, rate / D * l.mean_osl * t);
      if (want >= b) break;
      b = want;
      t = decode_step(*pm, b, ctx_len);
    }
    decode_rate += b / t;
    decode_step_s = std::max(decode_step_s, t);
  }
  const double prefill_done = l.prompt_tokens / prefill_rate;
  const double decode_done = l.output_tokens / decode_rate;
  // The last prompts still decode after the prefills end; the decodes cannot finish before the first arrive.
  const double work = std::max(prefill_done + l.mean_osl * decode_step_s, decode_done + first_prefill);
  est.seconds = std::max(work, span + first_prefill + l.mean_osl * decode_step_s);
  est.itl_s = decode_step_s;
  est.ttft_s = first_prefill;
  if (rate > 0) {
    // Prompts queue for the prefill pool: an M/D/1 wait, Wq = rho * s / (2 (1 - rho)),
    // with s one prompt's prefill on one worker.
    const double s = l.mean_isl / (prefill_rate / static_cast<double>(prefill_models.size()));
    const double rho = rate * l.mean_isl / prefill_rate;
    est.ttft_s += rho < 1 ? rho * s / (2 * (1 - rho)) : std::numeric_limits<double>::infinity();
  }
  est.overloaded = rate > 0 && (prefill_done > span * 1.05 || decode_done > span * 1.05);
  return est;
}

namespace {

class Static : public Policy {
 public:
  explicit Static(Split s) : s_(s) {}
  std::string name() const override { return s_.agg() ? "agg" : "static:" + std::to_string(s_.prefill) + ":" + std::to_string(s_.decode); }
  Split choose(const EpochView& e, const PlanContext& ctx, double& predicted) override {
    predicted = estimate_epoch_seconds(e.requests, s_, ctx);
    return s_;
  }

 private:
  Split s_;
};

// Dynamo's SLA planner (components/planner, "SLA-based planner"), as a value:
//   prefill replicas = ceil(load_isl / prefill throughput per GPU at the TTFT target)
//   decode replicas  = ceil(load_osl / decode throughput per GPU at the ITL target)
// with the load predicted as the last epoch's (Dynamo's constant predictor), and
// the per-GPU throughputs from profiling (here: the performance model). The
// workers are fixed, so replicas become a proportion of them. Epoch 0 has
// nothing observed: an even split, as tandem's default prefill_fraction.
class Sla : public Policy {
 public:
  std::string name() const override { return "sla"; }
  Split choose(const EpochView& e, const PlanContext& ctx, double& predicted) override {
    const auto n = ctx.size();
    Split s{std::clamp<int64_t>(n / 2, 1, n - 1), n - std::clamp<int64_t>(n / 2, 1, n - 1)};
    if (n < 2) s = {0, n};
    if (n >= 2 && e.history && !e.history->empty()) {
      const EpochRecord& last = e.history->back();
      const SimOptions& o = *ctx.options;
      // Per cell: its prefill form's workers, or its decode form's (one worker, with one width).
      const Cell& cell = ctx.cells.front();
      const PerfModel& ppm = *cell.prefill.front();
      const PerfModel& pm = *cell.decode.front();
      // Prefill throughput per GPU: the biggest batch whose step meets the TTFT target.
      double tokens = static_cast<double>(o.max_batched_tokens);
      if (o.ttft_target_s > 0)
        while (tokens > 16 && prefill_step(ppm, tokens, last.mean_isl) > o.ttft_target_s) tokens /= 2;
      const double prefill_tps = tokens / prefill_step(ppm, tokens, last.mean_isl) * static_cast<double>(cell.prefill.size());
      // Decode throughput per GPU: the biggest batch whose step meets the ITL target.
      const double ctx_len = last.mean_isl + last.mean_osl / 2.0;
      double b = std::max(1.0, std::min(static_cast<double>(o.max_num_seqs), std::floor(pm.kv_capacity_tokens() / std::max(1.0, last.mean_isl + last.mean_osl))));
      if (o.itl_target_s > 0)
        while (b > 1 && decode_step(pm, b, ctx_len) > o.itl_target_s) b = std::floor(b / 2);
      const double decode_tps = b / decode_step(pm, b, ctx_len) * static_cast<double>(cell.decode.size());
      const double need_p = last.prompt_tokens / prefill_tps, need_d = last.output_tokens / decode_tps;
      const auto p = std::clamp<int64_t>(std::llround(static_cast<double>(n) * need_p / (need_p + need_d)), 1, n - 1);
      s = {p, n - p};
    }
    predicted = estimate_epoch_seconds(e.requests, s, ctx);
    return s;
  }
};

// Ours: the next epoch's lengths are known; estimate every split and take the
// best. With a target, splits whose estimated decode step breaks the ITL
// target are passed over while any split meets it. A split within 2% of the
// best that is already in place is kept: a re-split drains workers.
class Lookahead : public Policy {
 public:
  std::string name() const override { return "lookahead"; }
  Split choose(const EpochView& e, const PlanContext& ctx, double& predicted) override {
    const auto n = ctx.size();
    const SimOptions& o = *ctx.options;
    // With targets: only splits expected to meet them compete (all, if none is).
    std::vector<std::pair<Split, EpochEstimate>> est;
    bool any_meets = false;
    auto meets = [&](const EpochEstimate& x) {
      return !x.overloaded && (o.itl_target_s <= 0 || x.itl_s <= o.itl_target_s) &&
             (o.ttft_target_s <= 0 || x.ttft_s <= o.ttft_target_s);
    };
    for (const Split& s : all_splits(n)) {
      est.emplace_back(s, estimate_epoch(e.requests, s, ctx));
      any_meets = any_meets || meets(est.back().second);
    }
    Split best{0, n};
    double best_t = std::numeric_limits<double>::infinity();
    double current_t = std::numeric_limits<double>::infinity();
    for (const auto& [s, x] : est) {
      if (any_meets && !meets(x)) continue;
      if (x.seconds < best_t) best = s, best_t = x.seconds;
      if (s == e.current) current_t = x.seconds;
    }
    if (e.index > 0 && current_t <= best_t * 1.02) {
      predicted = current_t;
      return e.current;
    }
    predicted = best_t;
    return best;
  }
};

// Evaluation only: the split whose true simulation of the rest of the run
// (EpochView::evaluate) costs least, found with a few simulations instead of
// one per split. docs/planner.md argues what the search gives up.
//   - The split in place costs what it cost when chosen (whole-run costs),
//     so keeping it needs no simulation.
//   - The prefill count P is found by a local search from the last epoch's
//     best P: its neighbours, then steps that double while the cost falls,
//     then halving the bracket, to a P better than both of its neighbours.
//     The first epoch starts where the look-ahead estimate puts the best P.
//   - Then agg.
// Splits compare by (cost, P), so ties go to agg, then to fewer prefill
// workers, as in a scan in all_splits order. Every simulation gives up once
// it cannot beat the split it is compared with (the local search's best so
// far, or for agg the best found), so the search takes the same path as
// with full simulations. With up to kScanAllUpTo workers every split is
// simulated: there the scan is as cheap as the search.
class Oracle : public Policy {
 public:
  static constexpr int64_t kScanAllUpTo = 8;

  std::string name() const override { return "oracle"; }
  Split choose(const EpochView& e, const PlanContext& ctx, double& predicted) override {
    if (!e.evaluate) throw Error("the oracle policy needs the simulator (it is for `tandem simulate` only)");
    const auto n = ctx.size();
    cost_.assign(static_cast<std::size_t>(n), kUnknown);
    eval_ = &e.evaluate;
    n_ = n;
    if (e.index == last_epoch_ + 1 && e.current == last_choice_ && last_choice_.prefill < n)
      cost_[static_cast<std::size_t>(last_choice_.prefill)] = last_cost_;
    if (n <= kScanAllUpTo) {
      for (int64_t p = 0; p < n; ++p) cost(p, best_cost());
    } else {
      int64_t start = last_p_;
      if (start < 1) start = model_best_p(e, ctx);
      last_p_ = local_min(start);
      cost(0, best_cost());
    }
    const int64_t p = best();
    last_epoch_ = e.index;
    last_choice_ = p == 0 ? Split{0, n} : Split{p, n - p};
    last_cost_ = cost_of(p);
    const SimOptions& o = *ctx.options;
    const bool targets = o.ttft_target_s > 0 || o.itl_target_s > 0;
    predicted = targets ? last_cost_ : last_cost_ - e.now_s;  // minus goodput, or the rest of the makespan
    return last_choice_;
  }

 private:
  static constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
  static constexpr double kNoBound = std::numeric_limits<double>::infinity();

  double cost_of(int64_t p) const { return cost_[static_cast<std::size_t>(p)]; }
  bool known(int64_t p) const { return !std::isnan(cost_of(p)); }
  // The order splits compare in: cost, then fewer prefill workers (agg first).
  bool better(int64_t a, int64_t b) const {
    return cost_of(a) < cost_of(b) || (cost_of(a) == cost_of(b) && a < b);
  }
  int64_t best() const {  // -1: nothing simulated yet
    int64_t b = -1;
    for (int64_t p = 0; p < n_; ++p)
      if (known(p) && (b < 0 || better(p, b))) b = p;
    return b;
  }
  double best_cost() const { return best() < 0 ? kNoBound : cost_of(best()); }
  // P's cost, simulated once per epoch; above give_up_above it may be only a bound above it.
  double cost(int64_t p, double give_up_above) {
    if (!known(p)) cost_[static_cast<std::size_t>(p)] = (*eval_)(p == 0 ? Split{0, n_} : Split{p, n_ - p}, give_up_above);
    return cost_of(p);
  }
  // Whether P = t beats the incumbent m (simulating t only as far as that takes).
  bool beats(int64_t t, int64_t m) {
    cost(t, cost_of(m));
    return better(t, m);
  }

  // A P in [1, n-1] that beats both of its neighbours, found from `start`.
  int64_t local_min(int64_t start) {
    int64_t m = std::clamp<int64_t>(start, 1, n_ - 1);
    cost(m, kNoBound);
    const int64_t left = m - 1, right = m + 1;
    int64_t d = 0;
    if (left >= 1 && beats(left, m)) d = -1;
    if (right <= n_ - 1 && beats(right, d < 0 ? left : m)) d = 1;
    if (d == 0) return m;
    // Walk downhill with steps that double; lo..hi then bracket a local minimum around m.
    int64_t behind = m;
    m += d;
    int64_t ahead = m + d, step = 2;
    for (;;) {
      const int64_t next = std::clamp<int64_t>(m + d * step, 1, n_ - 1);
      if (next == m) {  // at the end of the range: the bracket's far side is outside it
        ahead = m + d;
        break;
      }
      if (!beats(next, m)) {
        ahead = next;
        break;
      }
      behind = m;
      m = next;
      step *= 2;
    }
    int64_t lo = std::min(behind, ahead), hi = std::max(behind, ahead);
    // Halve the larger side of the bracket until m's neighbours are its ends.
    while (hi - lo > 2) {
      const int64_t t = m - lo > hi - m ? lo + (m - lo) / 2 : m + (hi - m + 1) / 2;
      if (beats(t, m)) {
        (t < m ? hi : lo) = m;
        m = t;
      } else {
        (t < m ? lo : hi) = t;
      }
    }
    return m;
  }

  // Where the look-ahead estimate of the epoch's own requests puts the best
  // P: the first epoch's starting point (nothing simulated yet to start from).
  int64_t model_best_p(const EpochView& e, const PlanContext& ctx) const {
    int64_t best_p = std::max<int64_t>(1, n_ / 2);
    double best_t = std::numeric_limits<double>::infinity();
    for (int64_t p = 1; p < n_; ++p) {
      const double t = estimate_epoch_seconds(e.requests, {p, n_ - p}, ctx);
      if (t < best_t) best_p = p, best_t = t;
    }
    return best_p;
  }

  // This epoch's search.
  const std::function<double(const Split&, double)>* eval_ = nullptr;
  int64_t n_ = 0;
  std::vector<double> cost_;  // [n] by P (0: agg); NaN: not simulated
  // What the last epoch found: its choice and that choice's whole-run cost,
  // still exact now if the choice stays; and its best P, where the search starts.
  int64_t last_epoch_ = -2;
  Split last_choice_;
  double last_cost_ = 0;
  int64_t last_p_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_policy(const std::string& spec, int64_t workers) {
  if (spec == "agg") return std::make_unique<Static>(Split{0, workers});
  if (spec == "sla") return std::make_unique<Sla>();
  if (spec == "lookahead") return std::make_unique<Lookahead>();
  if (spec == "oracle") return std::make_unique<Oracle>();
  if (spec.rfind("static:", 0) == 0) {
    const auto colon = spec.find(':', 7);
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no D");
      std::size_t used = 0;
      const int64_t p = std::stoll(spec.substr(7, colon - 7), &used);
      const int64_t d = std::stoll(spec.substr(colon + 1));
      if (p < 1 || d < 1 || p + d != workers)
        throw Error("policy '" + spec + "': P and D must be at least 1 and add up to the " + std::to_string(workers) +
                    " workers");
      return std::make_unique<Static>(Split{p, d});
    } catch (const std::invalid_argument&) {
    } catch (const std::out_of_range&) {
    }
    throw Error("policy '" + spec + "': write static:P:D with whole numbers, e.g. static:2:6");
  }
  throw Error("unknown policy '" + spec + "': use static:P:D, agg, sla, lookahead or oracle");
}

}  // namespace tandem::planner
