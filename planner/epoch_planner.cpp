#include "planner/epoch_planner.h"

#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tandem::planner {

EpochPlanner::EpochPlanner(SimOptions options, const ModelShape& shape, const HardwareProfile& base,
                           const std::string& policy)
    : o_(options), base_(base), policy_(make_policy(policy, options.workers)) {
  if (policy == "oracle") throw Error("planner.policy = \"oracle\" needs the simulator; use it with `tandem simulate`");
  forms_.push_back({1, shape, std::make_unique<PerfModel>(shape, base), {}, 0, {base, 0, 0}});
  ctx_.options = &o_;
  make_cells();
  current_ = {0, o_.workers};
}

EpochPlanner::EpochPlanner(SimOptions options, const ModelShape& shape, int prefill_tp, int decode_tp,
                           const HardwareProfile& base, const std::string& policy)
    : EpochPlanner(options, shape.at_width(decode_tp), base, policy) {
  forms_.front().width = decode_tp;
  if (prefill_tp != decode_tp) {
    const ModelShape at = shape.at_width(prefill_tp);
    forms_.push_back({prefill_tp, at, std::make_unique<PerfModel>(at, base), {}, 0, {base, 0, 0}});
  }
  make_cells();
}

void EpochPlanner::make_cells() {
  const PerfModel* decode = forms_.front().model.get();
  if (forms_.size() == 1) {
    ctx_.cells = worker_cells(std::vector<const PerfModel*>(static_cast<std::size_t>(o_.workers), decode));
    return;
  }
  const Form& p = forms_.back();
  ctx_.cells.assign(static_cast<std::size_t>(o_.workers),
                    two_width_cell(p.model.get(), p.width, decode, forms_.front().width));
}

EpochPlanner::Form& EpochPlanner::form_at(int width) {
  for (Form& f : forms_)
    if (f.width == width) return f;
  return forms_.front();  // 0, or a width the planner does not know: the decode width's
}

const ProfileFit& EpochPlanner::fit_at(int width) const {
  for (const Form& f : forms_)
    if (f.width == width) return f.fit;
  return forms_.front().fit;
}

void EpochPlanner::observe(std::span<const StepSample> steps, int width) {
  auto& samples = form_at(width).samples;
  samples.insert(samples.end(), steps.begin(), steps.end());
  constexpr std::size_t kKeep = 20000;  // the most recent steps
  if (samples.size() > kKeep) samples.erase(samples.begin(), samples.end() - static_cast<std::ptrdiff_t>(kKeep));
}

ProfileFit EpochPlanner::refit() {
  bool changed = false;
  for (Form& f : forms_) {
    if (f.samples.size() < 32 || f.samples.size() == f.fitted_at) continue;
    f.fit = fit_profile(f.shape, base_, f.samples);
    f.fitted_at = f.samples.size();
    if (f.fit.samples > 0) {
      f.model = std::make_unique<PerfModel>(f.shape, f.fit.profile);
      changed = true;
    }
  }
  if (changed) make_cells();
  return forms_.front().fit;
}

nlohmann::json EpochPlanner::profile_json() const {
  const ProfileFit& fit = forms_.front().fit;
  const auto& h = fit.profile;
  return {{"name", h.name},
          {"fitted_from_steps", fit.samples},
          {"rms_log_error", fit.rms_log_error},
          {"effective_flops", h.peak_flops * h.mfu},
          {"effective_bytes_per_s", h.hbm_bytes_per_s * h.mbu},
          {"step_overhead_s", h.step_overhead_s}};
}

std::string EpochPlanner::profile_toml() const {
  const ProfileFit& fit = forms_.front().fit;
  const auto& h = fit.profile;
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "# Fitted by tandem run from %zu measured engine steps (rms log error %.3f).\n"
                "name = \"%s\"\npeak_flops = %.6g\nhbm_bytes_per_s = %.6g\nhbm_bytes = %.6g\n"
                "link_bytes_per_s = %.6g\nlink_latency_s = %.6g\nmfu = %.6g\nmbu = %.6g\nstep_overhead_s = %.6g\n"
                "kv_memory_fraction = %.6g\nreload_bytes_per_s = %.6g\n",
                fit.samples, fit.rms_log_error, h.name.c_str(), h.peak_flops, h.hbm_bytes_per_s, h.hbm_bytes,
                h.link_bytes_per_s, h.link_latency_s, h.mfu, h.mbu, h.step_overhead_s, h.kv_memory_fraction,
                h.reload_bytes_per_s);
  return buf;
}

std::string EpochPlanner::Decision::describe() const {
  char buf[160];
  if (epoch > 0 && changed() && predicted_previous_s > 0)
    std::snprintf(buf, sizeof buf, "epoch %lld: %s -> %s, predicted %+.0f%% (%.2f s instead of %.2f s)",
                  static_cast<long long>(epoch), previous.name().c_str(), split.name().c_str(),
                  100.0 * (predicted_s - predicted_previous_s) / predicted_previous_s, predicted_s, predicted_previous_s);
  else
    std::snprintf(buf, sizeof buf, "epoch %lld: %s, predicted %.2f s", static_cast<long long>(epoch),
                  split.name().c_str(), predicted_s);
  return buf;
}

EpochPlanner::Decision EpochPlanner::decide(std::span<const Request> requests) {
  refit();
  Decision d;
  d.epoch = static_cast<int64_t>(history_.size());
  d.previous = current_;
  EpochView view;
  view.index = d.epoch;
  view.requests = requests;
  view.history = &history_;
  view.current = current_;
  d.split = policy_->choose(view, ctx_, d.predicted_s);
  d.predicted_previous_s = estimate_epoch_seconds(requests, current_, ctx_);
  EpochRecord rec;
  rec.index = d.epoch;
  rec.split = d.split;
  rec.predicted_s = d.predicted_s;
  rec.requests = static_cast<int64_t>(requests.size());
  for (const auto& r : requests) {
    rec.prompt_tokens += static_cast<double>(r.isl);
    rec.output_tokens += static_cast<double>(r.osl);
  }
  if (rec.requests > 0) {
    rec.mean_isl = rec.prompt_tokens / static_cast<double>(rec.requests);
    rec.mean_osl = rec.output_tokens / static_cast<double>(rec.requests);
  }
  history_.push_back(rec);
  measured_.push_back(-1);
  current_ = d.split;
  return d;
}

void EpochPlanner::measured(int64_t epoch, double seconds) {
  if (epoch >= 0 && epoch < static_cast<int64_t>(measured_.size())) measured_[static_cast<std::size_t>(epoch)] = seconds;
}

nlohmann::json EpochPlanner::summary() const {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t i = 0; i < history_.size(); ++i) {
    const auto& h = history_[i];
    nlohmann::json e = {{"epoch", h.index}, {"split", h.split.name()}, {"requests", h.requests},
                        {"predicted_s", h.predicted_s}};
    e["measured_s"] = measured_[i] >= 0 ? nlohmann::json(measured_[i]) : nlohmann::json(nullptr);
    out.push_back(e);
  }
  return out;
}

nlohmann::json EpochPlanner::finish(const std::string& profile_path) {
  refit();
  nlohmann::json out{{"epochs", summary()}, {"planner_profile", profile_json()}};
  std::ofstream(profile_path) << profile_toml();
  out["planner_profile"]["file"] = profile_path;
  return out;
}

}  // namespace tandem::planner
