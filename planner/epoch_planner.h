// The planner as a job uses it: one decision per epoch from the epoch's known
// requests (batch look-ahead), with its prediction, and what each epoch then
// measured. Shared by `tandem run` (job.mode = "auto") and `tandem plan`.
//
// Workers of one width, or of two (a prefill width and a decode width): then
// a split counts cells of lcm(prefill_tp, decode_tp) GPUs, each running
// prefill workers or decode workers (simulator.h, Cell), as `tandem simulate
// --tp P:D` plans them. Each width's model is fitted to the steps its own
// workers measured.
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
  // Identical workers of `base` hardware running a model of `shape` (at the workers' width, ModelShape::at_width).
  // policy: a name for make_policy.
  EpochPlanner(SimOptions options, const ModelShape& shape, const HardwareProfile& base, const std::string& policy);
  // Two widths: options.workers counts cells; `shape` is the whole model's (width 1).
  EpochPlanner(SimOptions options, const ModelShape& shape, int prefill_tp, int decode_tp, const HardwareProfile& base,
               const std::string& policy);

  // Engine steps the workers of `width` measured (0: of the one width, or
  // the decode width): from now on that width's profile is fitted to them
  // (refit at every decision once there are enough).
  void observe(std::span<const StepSample> steps, int width = 0);
  // The decode width's fit (the one width's).
  ProfileFit refit();
  const ProfileFit& fit_at(int width) const;

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
  // At the end of a job: the profile fitted to every step it measured,
  // written to `profile_path` as TOML (for `tandem simulate --hardware`);
  // the summary's "epochs" and "planner_profile" (with its file).
  nlohmann::json finish(const std::string& profile_path);

 private:
  // The workers of one width: their model, fitted to their steps.
  struct Form {
    int width = 1;
    ModelShape shape;  // at that width
    std::unique_ptr<PerfModel> model;
    std::vector<StepSample> samples;
    std::size_t fitted_at = 0;
    ProfileFit fit;
  };
  Form& form_at(int width);
  void make_cells();  // ctx_.cells from the forms' models
  SimOptions o_;
  HardwareProfile base_;
  std::vector<Form> forms_;  // the decode (or one) width first, then the prefill width if it differs
  PlanContext ctx_;
  std::unique_ptr<Policy> policy_;
  std::vector<EpochRecord> history_;
  std::vector<double> measured_;
  Split current_;
};

}  // namespace tandem::planner
