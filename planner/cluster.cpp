#include "planner/cluster.h"

#include <cstdio>
#include <limits>

#include "common/error.h"
#include "planner/policy.h"

namespace tandem::planner {

bool is_static(const std::string& policy) { return policy.rfind("static:", 0) == 0; }

// "static:P:D" counts GPUs per phase; the policies count what the simulator
// splits (workers; cells under a re-splitting policy with two widths).
std::string policy_in_units(const std::string& name, Widths w) {
  if (!is_static(name)) return name;
  int64_t p = 0, d = 0;
  if (std::sscanf(name.c_str(), "static:%ld:%ld", &p, &d) != 2 || p % w.prefill != 0 || d % w.decode != 0)
    throw Error("--policy " + name + ": static:P:D counts GPUs, whole workers of " + w.name() +
                " (tensor-parallel width) each");
  return "static:" + std::to_string(p / w.prefill) + ":" + std::to_string(d / w.decode);
}

namespace {

// GPUs [g, g + n) of one kind: a worker's (or a cell's) GPUs must be.
void one_kind(const std::vector<HardwareProfile>& hw, std::size_t g, std::size_t n, const Widths& w) {
  if (g + n > hw.size()) throw Error("--gpus " + std::to_string(hw.size()) + " is not whole workers of " + w.name());
  for (std::size_t k = g; k < g + n; ++k)
    if (hw[k].name != hw[g].name)
      throw Error("--tp " + w.name() + ": a worker's GPUs must be of one kind; GPUs " + std::to_string(g) + ".." +
                  std::to_string(g + n - 1) + " are not (order --hardware so)");
}

}  // namespace

// Workers, one model each from its first GPU's kind; with two widths the
// first prefill_gpus GPUs are the prefill workers.
Cluster cluster_at(const ModelShape& shape, const std::vector<HardwareProfile>& hw, Widths w, std::size_t prefill_gpus) {
  Cluster c;
  c.widths = w;
  for (std::size_t g = 0; g < hw.size();) {
    const bool prefill = w.mixed() && g < prefill_gpus;
    const int tp = prefill ? w.prefill : w.decode;
    one_kind(hw, g, static_cast<std::size_t>(tp), w);
    const PerfModel* m = c.model(shape, hw[g], tp);
    c.cells.push_back({{m}, {m}});
    c.prefill_workers += prefill ? 1 : 0;
    g += static_cast<std::size_t>(tp);
  }
  return c;
}

// Cells of two forms, for a policy that re-splits workers of two widths.
Cluster cells_at(const ModelShape& shape, const std::vector<HardwareProfile>& hw, Widths w) {
  Cluster c;
  c.widths = w;
  c.two_forms = true;
  const auto l = static_cast<std::size_t>(w.cell());
  if (hw.size() % l != 0)
    throw Error("--tp " + w.name() + ": a re-split moves " + std::to_string(l) + " GPUs at a time (whole workers of " +
                std::to_string(w.prefill) + " and of " + std::to_string(w.decode) + "), and --gpus " +
                std::to_string(hw.size()) + " is not a multiple of " + std::to_string(l) +
                "; give a multiple, or --policy static:P:D");
  for (std::size_t g = 0; g < hw.size(); g += l) {
    one_kind(hw, g, l, w);
    c.cells.push_back(two_width_cell(c.model(shape, hw[g], w.prefill), w.prefill, c.model(shape, hw[g], w.decode),
                                              w.decode));
  }
  return c;
}

// The cluster a policy runs on: a fixed split of two widths places its
// workers once; a re-splitting policy with two widths splits cells.
Cluster cluster_for(const std::string& policy, const ModelShape& shape,
                    const std::vector<HardwareProfile>& hw, Widths w) {
  if (!w.mixed()) return cluster_at(shape, hw, w);
  if (!is_static(policy)) return cells_at(shape, hw, w);
  int64_t p = 0, d = 0;
  if (std::sscanf(policy.c_str(), "static:%ld:%ld", &p, &d) != 2 || p + d != static_cast<int64_t>(hw.size()))
    throw Error("--policy " + policy + ": static:P:D counts GPUs, P + D = --gpus (" + std::to_string(hw.size()) + ")");
  return cluster_at(shape, hw, w, static_cast<std::size_t>(p));
}

// Whether a worker of `tp` GPUs of every kind holds the model and `tokens` of KV.
bool fits(const ModelShape& shape, const std::vector<HardwareProfile>& hw, int tp, double tokens) {
  for (std::size_t g = 0; g < hw.size(); ++g)
    if ((g == 0 || hw[g].name != hw[g - 1].name) &&
        PerfModel(shape.at_width(tp), hw[g]).kv_capacity_tokens() < tokens)
      return false;
  return true;
}

// Of 1, 2, 4, 8: the widths the model's heads split into, the GPUs make whole
// workers of (and a static policy's counts), and the weights and the longest
// request fit (a prefill worker holds the prompt, a decode worker all of
// it); the smallest (one width for both phases), or (search) the pair of
// prefill and decode widths whose simulation is fastest.
WidthChoice choose_widths(const std::string& chooser, const ModelShape& shape, const std::vector<HardwareProfile>& hw,
                          const std::vector<Request>& requests, SimOptions so, double longest_prompt, double longest,
                          bool search, const std::string& hardware) {
  const auto gpus = static_cast<int64_t>(hw.size());
  double best = std::numeric_limits<double>::infinity();
  std::string tried;
  Widths chosen;
  // One width first: a pair must beat it to be chosen (a re-split between widths regroups GPUs).
  std::vector<Widths> candidates;
  for (int a : {1, 2, 4, 8}) candidates.push_back({a, a});
  for (int a : {1, 2, 4, 8})
    for (int b : {1, 2, 4, 8})
      if (search && a != b) candidates.push_back({a, b});
  for (const Widths& w : candidates) {
    const int a = w.prefill, b = w.decode;
    if (gpus % w.cell() != 0) continue;
    if (!shape.width_problem(a).empty() || !shape.width_problem(b).empty()) continue;
    std::unique_ptr<Cluster> c;
    std::string policy;
    try {
      policy = policy_in_units(chooser, w);
      c = std::make_unique<Cluster>(cluster_for(chooser, shape, hw, w));
    } catch (const Error&) {
      continue;  // the static policy's GPUs are not whole workers of these widths
    }
    if (!fits(shape, hw, a, w.mixed() ? longest_prompt : longest) || !fits(shape, hw, b, longest)) {
      if (!w.mixed()) tried += " tp " + w.name() + ": does not fit;";  // a pair with a width that fits alone is said once
      continue;
    }
    if (!search) {
      chosen = w;
      break;
    }
    so.workers = c->units();
    Simulator sim(so, c->cells);
    auto p = make_policy(policy, so.workers);
    const double makespan = sim.run(requests, *p).makespan_s;
    char line[96];
    std::snprintf(line, sizeof line, " tp %s: %.2f s;", w.name().c_str(), makespan);
    tried += line;
    if (makespan < best) best = makespan, chosen = w;
  }
  if (chosen.decode == 0)
    throw Error("the model does not fit a worker of up to 8 " + hardware + " GPUs (" +
                std::to_string(static_cast<int64_t>(shape.weight_bytes / 1e9)) + " GB of weights, requests of up to " +
                std::to_string(static_cast<int64_t>(longest)) + " tokens):" + tried);
  return {chosen, tried};
}
// The policies `--policy all` compares: agg, fixed splits (up to 16 spread
// over the range, in GPUs), then the planners.
std::vector<std::string> all_policies(int64_t gpus, Widths w) {
  std::vector<std::string> out{"agg"};
  const int64_t step = w.mixed() ? w.cell() : w.decode, units = gpus / step;
  for (int64_t p = 1; p < units; ++p)
    if (units <= 16 || p % std::max<int64_t>(1, units / 8) == 0)
      out.push_back("static:" + std::to_string(p * step) + ":" + std::to_string((units - p) * step));
  out.insert(out.end(), {"sla", "lookahead", "oracle"});
  return out;
}


}  // namespace tandem::planner
