#include "planner/fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace tandem::planner {

ProfileFit fit_profile(const ModelShape& shape, const HardwareProfile& base, std::span<const StepSample> samples) {
  ProfileFit fit;
  fit.profile = base;
  std::vector<std::array<double, 3>> pts;  // flops, bytes, seconds
  HardwareProfile unit = base;
  unit.mfu = unit.mbu = 1;
  const PerfModel counter(shape, unit);
  for (const auto& s : samples) {
    if (s.seconds <= 0) continue;
    const auto [f, b] = counter.work(s.shape);
    pts.push_back({f, b, s.seconds});
  }
  if (pts.size() < 8) return fit;
  auto cost = [&](double P, double W, double o) {
    double e = 0;
    for (const auto& p : pts) {
      const double d = std::log(std::max(p[0] / P, p[1] / W) + o) - std::log(p[2]);
      e += d * d;
    }
    return e;
  };
  // Start from what the fastest steps imply, then coordinate descent in log space.
  double P = 0, W = 0, o = std::numeric_limits<double>::infinity();
  for (const auto& p : pts) P = std::max(P, p[0] / p[2]), W = std::max(W, p[1] / p[2]), o = std::min(o, p[2]);
  o *= 0.5;
  double best = cost(P, W, o);
  for (int round = 0; round < 200; ++round) {
    bool improved = false;
    for (double f : {0.5, 0.8, 0.95, 0.99, 1.01, 1.05, 1.25, 2.0}) {
      if (double c = cost(P * f, W, o); c < best) best = c, P *= f, improved = true;
      if (double c = cost(P, W * f, o); c < best) best = c, W *= f, improved = true;
      if (double c = cost(P, W, o * f); c < best) best = c, o *= f, improved = true;
    }
    if (!improved) break;
  }
  fit.profile.name = base.name + "-fitted";
  fit.profile.peak_flops = P;
  fit.profile.hbm_bytes_per_s = W;
  fit.profile.mfu = fit.profile.mbu = 1;
  fit.profile.step_overhead_s = o;
  fit.rms_log_error = std::sqrt(best / static_cast<double>(pts.size()));
  fit.samples = pts.size();
  return fit;
}

}  // namespace tandem::planner
