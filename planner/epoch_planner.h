// The planner as a job uses it: one decision per epoch from the epoch's known
// requests (batch look-ahead), with its prediction, and what each epoch then
// measured. Shared by `tandem run` (job.mode = "auto") and `tandem plan`.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/fit.h"
#include "planner/policy.h"

namespace tandem::planner {

class EpochPlanner {
 public:
  // Identical workers of `base` hardware running a model of `shape`. policy: a name for make_policy.
  EpochPlanner(SimOptions options, const ModelShape& shape, const HardwareProfile& base, const std::string& policy);

  // Engine steps the workers measured: from now on the profile is fitted to
  // them (refit at every decision once there are enough).
  void observe(std::span<const StepSample> steps);
  ProfileFit refit();

  struct Decision {
    int64_t epoch = 0;
    Split split, previous;
    double predicted_s = 0;           // this epoch under `split`
    double predicted_previous_s = 0;  // this epoch had the split not changed
    bool changed() const { return epoch == 0 || !(split == previous); }
    std::string describe() const;     // "epoch 7: 3P:5D -> 2P:6D, predicted -18% (41.2 s)"
  };
  Decision decide(std::span<const Request> requests);
  // What the epoch took, from its first request placed to its last finished.
  void measured(int64_t epoch, double seconds);
  const Split& current() const { return current_; }
  // Per epoch: split, requests, predicted_s, measured_s.
  nlohmann::json summary() const;
  // The profile now in use and how it was fitted, as JSON and as a TOML profile for `tandem simulate --hardware`.
  nlohmann::json profile_json() const;
  std::string profile_toml() const;

 private:
  SimOptions o_;
  ModelShape shape_;
  HardwareProfile base_;
  std::unique_ptr<PerfModel> model_;
  std::vector<StepSample> samples_;
  std::size_t fitted_at_ = 0;
  ProfileFit fit_;
  PlanContext ctx_;
  std::unique_ptr<Policy> policy_;
  std::vector<EpochRecord> history_;
  std::vector<double> measured_;
  Split current_;
};

}  // namespace tandem::planner
