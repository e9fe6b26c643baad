#include "planner/simulator.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "planner/policy.h"
#include "planner/sim_state.h"

namespace tandem::planner {

std::string Split::name() const {
  return agg() ? std::string("agg") : std::to_string(prefill) + "P:" + std::to_string(decode) + "D";
}

namespace {

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(std::min<double>(static_cast<double>(v.size() - 1), std::floor(p * static_cast<double>(v.size()))));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// A policy that always answers the same: the oracle's look-ahead copies use it.
class Fixed : public Policy {
 public:
  explicit Fixed(Split s) : s_(s) {}
  std::string name() const override { return s_.name(); }
  Split choose(const EpochView&, const PlanContext&, double&) override { return s_; }

 private:
  Split s_;
};

}  // namespace

std::vector<Cell> worker_cells(const std::vector<const PerfModel*>& models) {
  std::vector<Cell> cells;
  for (const PerfModel* m : models) cells.push_back({{m}, {m}});
  return cells;
}

Cell two_width_cell(const PerfModel* prefill, int prefill_tp, const PerfModel* decode, int decode_tp) {
  const int l = std::lcm(prefill_tp, decode_tp);
  return {std::vector<const PerfModel*>(static_cast<std::size_t>(l / prefill_tp), prefill),
          std::vector<const PerfModel*>(static_cast<std::size_t>(l / decode_tp), decode)};
}

Simulator::Simulator(SimOptions options, std::vector<const PerfModel*> models)
    : Simulator(options, worker_cells(models)) {}

Simulator::Simulator(SimOptions options, std::vector<Cell> cells) : o_(options) {
  if (o_.workers < 1 || static_cast<int64_t>(cells.size()) != o_.workers)
    throw Error("simulator: need one cell (performance models) per worker (" + std::to_string(o_.workers) + ")");
  for (const Cell& c : cells)
    if (c.prefill.empty() || c.decode.empty()) throw Error("simulator: a cell without workers");
  if (o_.epoch_requests < 1) throw Error("simulator: epoch_requests must be at least 1");
  ctx_.options = &o_;
  ctx_.cells = std::move(cells);
}

// Starts, runs or continues a state until every request has finished or
// stop() says so; `policy` chooses each epoch's split.
template <class Stop>
static void drive(SimState& s, Policy& policy, const PlanContext& ctx, const Simulator* sim, Stop&& stop) {
  auto on_epoch = [&](int64_t e) {
    const auto n_req = static_cast<int64_t>(s.reqs->size());
    const int64_t lo = e * s.o->epoch_requests, hi = std::min(n_req, lo + s.o->epoch_requests);
    EpochRecord rec;
    rec.index = e;
    rec.start_s = -1;
    rec.requests = hi - lo;
    for (int64_t i = lo; i < hi; ++i) {
      rec.prompt_tokens += static_cast<double>((*s.reqs)[static_cast<std::size_t>(i)].isl);
      rec.output_tokens += static_cast<double>((*s.reqs)[static_cast<std::size_t>(i)].osl);
    }
    rec.mean_isl = rec.prompt_tokens / static_cast<double>(rec.requests);
    rec.mean_osl = rec.output_tokens / static_cast<double>(rec.requests);
    EpochView view;
    view.index = e;
    view.requests = std::span<const Request>(s.reqs->data() + lo, static_cast<std::size_t>(hi - lo));
    view.history = &s.epochs;
    view.current = s.split;
    view.now_s = s.now;
    if (sim) {
      view.evaluate = [&s, sim](const Split& split, double give_up_above) {
        return sim->rest_of_run_cost(s, split, give_up_above);
      };
    }
    double predicted = 0;
    rec.split = policy.choose(view, ctx, predicted);
    rec.predicted_s = predicted;
    s.epochs.push_back(rec);
    s.epoch_left.push_back(rec.requests);
    s.apply_split(rec.split, s.epochs.size() == 1);
    s.sample(true);
  };
  s.run(on_epoch, stop);
}

double Simulator::rest_of_run_cost(const SimState& state, const Split& split, double give_up_above) const {
  // Receding horizon: the rest of the run with `split` from this epoch on; the
  // next epoch decides again. (Scoring only this epoch's own requests is
  // myopic: a split can finish them sooner and everything else later.)
  SimState copy = state;
  Fixed fixed(split);
  const bool targets = o_.ttft_target_s > 0 || o_.itl_target_s > 0;
  // While a request is unfinished the run ends at or after the clock, and at
  // best every unfinished request meets the targets: a bound the cost cannot
  // go under, which only rises as the copy runs.
  const auto n = static_cast<double>(copy.reqs->size());
  auto lower_bound = [&] {
    return targets ? -(n - static_cast<double>(copy.finished_missed)) / std::max(copy.now, 1e-9) : copy.now;
  };
  bool gave_up = false;
  // The epoch being decided has no record yet: `fixed` gives it.
  drive(copy, fixed, ctx_, nullptr, [&] { return gave_up = lower_bound() > give_up_above; });
  if (gave_up) return lower_bound();
  double end = 0;
  int64_t good = 0;
  for (std::size_t i = 0; i < copy.rs.size(); ++i) {
    end = std::max(end, copy.rs[i].finished);
    good += meets_targets(o_, (*copy.reqs)[i], copy.rs[i]) ? 1 : 0;
  }
  if (!targets) return end;
  return -static_cast<double>(good) / std::max(end, 1e-9);  // goodput over the whole run, negated
}

SimResult Simulator::run(const std::vector<Request>& requests, Policy& policy) {
  SimState s;
  s.o = &o_;
  s.reqs = &requests;
  s.placement.block_size = o_.block_size;
  s.placement.local_prefill_tokens = o_.local_prefill_tokens;
  s.placement.prefill_saturation_tokens = o_.prefill_saturation_tokens > 0
                                              ? o_.prefill_saturation_tokens
                                              : router::default_prefill_saturation(o_.max_batched_tokens);
  s.rs.resize(requests.size());
  // Every cell's workers; a cell of two forms starts on its decode form (aggregated).
  auto add = [&s](const PerfModel* m, int32_t cell, Role role) {
    WorkerState ws;
    ws.pm = m;
    ws.cell = cell;
    ws.role = role;
    ws.kv_cap = m->kv_capacity_tokens();
    if (ws.kv_cap < 1)
      throw Error("simulator: the model's weights (" + std::to_string(m->shape().weight_bytes / 1e9) +
                  " GB) do not fit worker " + std::to_string(s.w.size()) + "'s memory (" + m->hardware().name + ")");
    s.w.push_back(ws);
    return static_cast<int32_t>(s.w.size() - 1);
  };
  for (std::size_t k = 0; k < ctx_.cells.size(); ++k) {
    const Cell& cell = ctx_.cells[k];
    const auto id = static_cast<int32_t>(k);
    CellState cs;
    for (const PerfModel* m : cell.decode) cs.decode.push_back(add(m, id, Role::kAgg));
    if (cell.one_form()) cs.prefill = cs.decode;
    else
      for (const PerfModel* m : cell.prefill) cs.prefill.push_back(add(m, id, Role::kIdle));
    s.cells.push_back(std::move(cs));
    s.by_speed.push_back(id);
  }
  std::stable_sort(s.by_speed.begin(), s.by_speed.end(), [&](int32_t a, int32_t b) {
    return ctx_.cells[static_cast<std::size_t>(a)].peak_flops() > ctx_.cells[static_cast<std::size_t>(b)].peak_flops();
  });
  // A decode worker holds a whole sequence; a prefill-only worker of a cell of two forms, its prompt.
  for (const auto& r : requests) {
    for (const CellState& c : s.cells)
      for (bool decode : {true, false}) {
        if (!decode && c.one_form()) continue;
        const double need = static_cast<double>(decode ? r.isl + r.osl : r.isl);
        for (int32_t k : decode ? c.decode : c.prefill)
          if (need > s.wk(k).kv_cap)
            throw Error("simulator: a request of " + std::to_string(static_cast<int64_t>(need)) +
                        " tokens does not fit one worker's KV memory (" +
                        std::to_string(static_cast<int64_t>(s.wk(k).kv_cap)) + " tokens)");
      }
  }
  drive(s, policy, ctx_, this, [] { return false; });

  SimResult res;
  res.requests = static_cast<int64_t>(requests.size());
  std::vector<double> ttft, itl;
  ttft.reserve(requests.size());
  itl.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const ReqState& r = s.rs[i];
    res.makespan_s = std::max(res.makespan_s, r.finished);
    res.output_tokens += static_cast<double>(requests[i].osl);
    const double t = r.first_token - requests[i].arrival_s;
    const double l = requests[i].osl > 1 ? (r.finished - r.first_token) / static_cast<double>(requests[i].osl - 1) : 0;
    ttft.push_back(t);
    if (requests[i].osl > 1) itl.push_back(l);
    res.good_requests += meets_targets(o_, requests[i], r) ? 1 : 0;
  }
  res.ttft_p50_s = percentile(ttft, 0.5);
  res.ttft_p90_s = percentile(ttft, 0.9);
  res.ttft_p99_s = percentile(ttft, 0.99);
  res.itl_p50_s = percentile(itl, 0.5);
  res.itl_p90_s = percentile(itl, 0.9);
  res.itl_p99_s = percentile(itl, 0.99);
  s.sample(true);
  res.epochs = std::move(s.epochs);
  res.timeline = std::move(s.timeline);
  res.placements = std::move(s.placements);
  return res;
}

}  // namespace tandem::planner
