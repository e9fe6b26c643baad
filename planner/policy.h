// Planner policies: at each epoch boundary, the split of the workers for the
// next epoch. One interface, values chosen by name:
//   static:P:D  the same split throughout
//   agg         every worker prefills and decodes (chunked prefill)
//   sla         Dynamo's SLA planner, reimplemented: prefill and decode
//               replicas from the last epoch's observed load and the per-GPU
//               throughputs that meet the TTFT/ITL targets, scaled to the
//               workers there are (it reacts; it cannot see ahead)
//   lookahead   ours: the next epoch's prompt and output lengths are known
//               (batch look-ahead); it estimates each split's duration of
//               that epoch (or goodput under targets) and takes the best,
//               aggregated mode included
//   oracle      for evaluation only: the split whose true simulation of the
//               rest of the run costs least, searched over the splits with a
//               few simulations an epoch (every split up to 8 workers)
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "planner/simulator.h"

namespace tandem::planner {

struct EpochView {
  int64_t index = 0;
  std::span<const Request> requests;        // this epoch's, known ahead (batch look-ahead)
  const std::vector<EpochRecord>* history = nullptr;  // finished epochs, and the current one so far
  Split current;
  double now_s = 0;
  // Only for the oracle: the true outcome of the run if it goes on with
  // `split` (a copy of the simulation, run ahead): its cost, lower is better —
  // the whole run's makespan, or with targets, minus its goodput. The copy
  // gives up once the cost is sure to exceed give_up_above, and then answers
  // a bound above it (Simulator::rest_of_run_cost). Blocks for the copy's run.
  std::function<double(const Split&, double give_up_above)> evaluate;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // predicted_s: the policy's prediction of the epoch's duration (0 if it makes none).
  virtual Split choose(const EpochView& epoch, const PlanContext& ctx, double& predicted_s) = 0;
};

// "static:P:D", "agg", "sla", "lookahead", "oracle"; throws tandem::Error on
// an unknown name or a split that does not fit the workers.
std::unique_ptr<Policy> make_policy(const std::string& spec, int64_t workers);

// Every split of n workers a policy may choose: agg, then 1P:(n-1)D … (n-1)P:1D.
std::vector<Split> all_splits(int64_t workers);

// The look-ahead estimate of `requests` on the workers under `split`, from the
// performance models alone (no simulation): how long they take, and the
// typical inter-token latency and time to first token they would see (for
// the targets). Used by the lookahead policy and `tandem plan`.
struct EpochEstimate {
  double seconds = 0;
  double itl_s = 0;
  double ttft_s = 0;
  bool overloaded = false;  // arrivals outpace a pool: queues (and TTFT) grow without bound
};
EpochEstimate estimate_epoch(std::span<const Request> requests, const Split& split, const PlanContext& ctx);
inline double estimate_epoch_seconds(std::span<const Request> requests, const Split& split, const PlanContext& ctx) {
  return estimate_epoch(requests, split, ctx).seconds;
}

}  // namespace tandem::planner
