// A hardware profile fitted to measured engine steps: the effective compute
// rate P, memory rate W and per-step overhead o that make the roofline
//   t = max(flops / P, bytes / W) + o
// best explain the steps' durations (least squares on log time, so short and
// long steps weigh alike). The result keeps `base`'s memory and link figures
// and has mfu = mbu = 1 (the fitted rates are what the steps achieved).
#pragma once

#include <span>

#include "planner/perf_model.h"
#include "runtime/engine/step_shape.h"

namespace tandem::planner {

// A step a worker measured: its load and its seconds.
using StepSample = runtime::StepSample;

struct ProfileFit {
  HardwareProfile profile;
  double rms_log_error = 0;  // of the fit over the samples
  std::size_t samples = 0;
};

// Needs at least a few samples (else returns base unchanged with samples = 0).
ProfileFit fit_profile(const ModelShape& shape, const HardwareProfile& base, std::span<const StepSample> samples);

}  // namespace tandem::planner
