// A discrete-event simulation of a Tandem job: the router places requests on
// workers with the same cost function as `tandem run` (router::choose_worker),
// each worker runs engine steps whose duration comes from the PerfModel
// roofline, prefilled KV travels over the link, and at every epoch boundary a
// planner Policy chooses the next prefill:decode split (or aggregated mode).
// Time is virtual; nothing runs a model.
//
// What a worker does, as Tandem's engine does it: continuous batching up to
// max_num_seqs sequences and max_batched_tokens tokens per step; every
// running sequence decodes one token per step; prompts prefill in chunks in
// the same steps (aggregated) or on prefill-only workers (disaggregated, and
// then the KV moves to the decode worker, which admits the sequence when it
// lands). Short prompts (under local_prefill_tokens) prefill on their decode
// worker, as the router does. KV for a sequence's whole length is reserved at
// admission; a worker admits no more than its KV memory holds.
//
// At a re-split only the workers whose role changes drain: they take no new
// work and switch once empty; the others keep working.
//
// A split gives roles to cells. With one tensor-parallel width a cell is one
// worker. With different prefill and decode widths (a and b GPUs) it is
// lcm(a, b) GPUs that run either lcm/a prefill workers or lcm/b decode (or
// aggregated) workers: a re-split that moves a cell between prefill and
// decode drains its workers, then regroups its GPUs; the other cells keep
// working.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "planner/perf_model.h"
#include "planner/workload.h"

namespace tandem::planner {

// A split of the cells (workers, with one width): `prefill` prefill-only and
// the rest decode, or all aggregated (prefill == 0).
struct Split {
  int64_t prefill = 0;
  int64_t decode = 0;
  bool agg() const { return prefill == 0; }
  std::string name() const;  // "agg" or "3P:5D"
  bool operator==(const Split&) const = default;
};

struct SimOptions {
  int64_t workers = 8;               // cells (what a split counts): workers of one width each, or PlanContext::cells
  int64_t max_num_seqs = 256;        // per worker
  int64_t max_batched_tokens = 8192; // per step
  int64_t epoch_requests = 1024;
  int64_t local_prefill_tokens = 0;  // disaggregated: shorter prompts prefill on their decode worker
  int64_t block_size = 16;
  double ttft_target_s = 0;          // for goodput and the sla/lookahead targets; 0: none
  double itl_target_s = 0;
  // Queued prompt tokens at which a prefill worker counts as saturated
  // (router::place); 0: the job's, router::default_prefill_saturation.
  int64_t prefill_saturation_tokens = 0;
  bool record_placements = false;    // SimResult::placements
};

// What one epoch looked like, as the planner sees it afterwards.
struct EpochRecord {
  int64_t index = 0;
  Split split;
  double start_s = 0, end_s = 0;       // first dispatch; last of its requests finished
  double predicted_s = 0;              // the policy's prediction of its duration (0: none)
  int64_t requests = 0;
  double prompt_tokens = 0, output_tokens = 0;
  double mean_isl = 0, mean_osl = 0;
};

struct SimResult {
  double makespan_s = 0;
  int64_t requests = 0;
  double output_tokens = 0;
  double ttft_p50_s = 0, ttft_p90_s = 0, ttft_p99_s = 0;
  double itl_p50_s = 0, itl_p90_s = 0, itl_p99_s = 0;
  int64_t good_requests = 0;  // meeting both targets (all when there are none)
  std::vector<EpochRecord> epochs;
  struct Sample {
    double t = 0;
    int64_t prefill = 0, decode = 0, agg = 0;  // workers per role at t
    double output_tokens_per_s = 0;           // over the last interval
  };
  std::vector<Sample> timeline;
  // With record_placements, in dispatch order: (decode worker, prefill worker or -1).
  std::vector<std::pair<int32_t, int32_t>> placements;
  double output_tokens_per_s() const { return makespan_s > 0 ? output_tokens / makespan_s : 0; }
  double goodput_per_s() const { return makespan_s > 0 ? static_cast<double>(good_requests) / makespan_s : 0; }
};

class Policy;
struct SimState;  // the state of a run between events (copyable: the oracle tries splits on copies)

// What a split gives one role: its workers' models as prefill workers and as
// decode (or aggregated) workers. One worker: both lists hold its model.
struct Cell {
  std::vector<const PerfModel*> prefill, decode;
  bool one_form() const { return prefill == decode; }
  double peak_flops() const { return decode.front()->hardware().peak_flops; }
};
// One cell per worker (workers of one width; heterogeneous clusters have several kinds).
std::vector<Cell> worker_cells(const std::vector<const PerfModel*>& models);
// One cell of lcm(prefill_tp, decode_tp) GPUs: lcm / prefill_tp workers of
// `prefill` in the prefill form, lcm / decode_tp of `decode` in the other.
Cell two_width_cell(const PerfModel* prefill, int prefill_tp, const PerfModel* decode, int decode_tp);

// The models a policy may consult, by cell (heterogeneous clusters have
// several kinds), in cell order; prefill roles go to the fastest (peak_flops) first.
struct PlanContext {
  const SimOptions* options = nullptr;
  std::vector<Cell> cells;
  int64_t size() const { return static_cast<int64_t>(cells.size()); }
};

class Simulator {
 public:
  // models: one per worker (the same pointer for identical GPUs); must outlive the simulator.
  Simulator(SimOptions options, std::vector<const PerfModel*> models);
  // cells: options.workers of them, what each split counts.
  Simulator(SimOptions options, std::vector<Cell> cells);
  SimResult run(const std::vector<Request>& requests, Policy& policy);

  // For the oracle: the cost of the whole run when it goes on from `state`
  // (an epoch being decided) with `split` for this epoch and every later one —
  // its makespan (s from the start), or with targets, minus its goodput
  // (requests meeting both per second). Lower is better. Whole-run figures, so
  // the cost a split had when chosen is still its cost at the next epoch if
  // it is kept.
  // give_up_above: once the cost is sure to exceed it, the copy stops and the
  // answer is a lower bound of the true cost, still above give_up_above (the
  // simulated clock has passed it; with targets, even if every unfinished
  // request met them). A cost at or below it is always exact.
  double rest_of_run_cost(const SimState& state, const Split& split,
                          double give_up_above = std::numeric_limits<double>::infinity()) const;

  const PlanContext& context() const { return ctx_; }

 private:
  SimOptions o_;
  PlanContext ctx_;
};

}  // namespace tandem::planner
