// The cluster `tandem simulate` runs a job on: tensor-parallel widths,
// workers or cells of two forms made of simulated GPUs, the policies it
// compares, and the choice of widths by fit or by simulation. The command
// (launcher/simulate_command.cpp) parses options and prints; this decides.
#pragma once

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "planner/hardware.h"
#include "planner/perf_model.h"
#include "planner/simulator.h"

namespace tandem::planner {

// Tensor-parallel widths of the prefill and the decode workers (0: to be chosen).
struct Widths {
  int prefill = 0, decode = 0;
  bool mixed() const { return prefill != decode; }
  // The GPUs a re-split moves between roles: whole workers of either width.
  int cell() const { return std::lcm(prefill, decode); }
  std::string name() const {
    return mixed() ? std::to_string(prefill) + ":" + std::to_string(decode) : std::to_string(decode);
  }
};

// What the simulator splits. With one width, or two under a fixed split,
// workers (the prefill ones first); with two widths under a re-splitting
// policy, cells of lcm(P, D) GPUs, each running prefill workers of width P
// or decode workers of width D (a re-split drains a cell and regroups it).
struct Cluster {
  Widths widths;
  std::vector<std::unique_ptr<PerfModel>> owned;
  std::vector<Cell> cells;
  int64_t prefill_workers = 0;  // two widths, fixed split: the first ones
  bool two_forms = false;
  int64_t units() const { return static_cast<int64_t>(cells.size()); }
  const PerfModel* model(const ModelShape& shape, const HardwareProfile& hw, int tp) {
    owned.push_back(std::make_unique<PerfModel>(shape.at_width(tp), hw));
    return owned.back().get();
  }
  // A split in workers: "agg", "3P:10D".
  std::string split_name(const Split& s) const {
    if (!two_forms || s.agg()) return s.name();
    const int l = widths.cell();
    return std::to_string(s.prefill * (l / widths.prefill)) + "P:" + std::to_string(s.decode * (l / widths.decode)) + "D";
  }
  std::string describe() const {
    const Widths& w = widths;
    if (two_forms)
      return std::to_string(units()) + " cells of " + std::to_string(w.cell()) + " GPUs, each " +
             std::to_string(w.cell() / w.prefill) + " prefill worker(s) of tp " + std::to_string(w.prefill) + " or " +
             std::to_string(w.cell() / w.decode) + " decode worker(s) of tp " + std::to_string(w.decode);
    if (w.mixed())
      return std::to_string(prefill_workers) + " prefill worker(s) of tp " + std::to_string(w.prefill) + " and " +
             std::to_string(units() - prefill_workers) + " decode worker(s) of tp " + std::to_string(w.decode);
    return std::to_string(units()) + " worker(s) of tp " + std::to_string(w.decode);
  }
};

bool is_static(const std::string& policy);
// "static:P:D" counts GPUs; the policies count what the simulator splits
// (workers; cells under a re-splitting policy with two widths).
std::string policy_in_units(const std::string& name, Widths w);
// Workers, one model each from its first GPU's kind; with two widths the
// first prefill_gpus GPUs are the prefill workers.
Cluster cluster_at(const ModelShape& shape, const std::vector<HardwareProfile>& hw, Widths w, std::size_t prefill_gpus = 0);
// Cells of two forms, for a policy that re-splits workers of two widths.
Cluster cells_at(const ModelShape& shape, const std::vector<HardwareProfile>& hw, Widths w);
// The cluster a policy runs on: a fixed split of two widths places its
// workers once; a re-splitting policy with two widths splits cells.
Cluster cluster_for(const std::string& policy, const ModelShape& shape, const std::vector<HardwareProfile>& hw, Widths w);
// Whether a worker of `tp` GPUs of every kind holds the model and `tokens` of KV.
bool fits(const ModelShape& shape, const std::vector<HardwareProfile>& hw, int tp, double tokens);
// Of 1, 2, 4, 8: the widths the model's heads split into, the GPUs make
// whole workers of (and a static policy's counts), and the weights and the
// longest request fit; the smallest (one width for both phases), or
// (search) the pair of prefill and decode widths whose simulation under
// `chooser` is fastest. `tried`: what each candidate gave, for the log.
// Throws tandem::Error when none fits (`hardware`: the GPUs' name, for it).
struct WidthChoice {
  Widths chosen;
  std::string tried;  // " tp 1: does not fit; tp 2: 3.10 s;" ...
};
WidthChoice choose_widths(const std::string& chooser, const ModelShape& shape, const std::vector<HardwareProfile>& hw,
                          const std::vector<Request>& requests, SimOptions so, double longest_prompt, double longest,
                          bool search, const std::string& hardware);
// The policies `--policy all` compares: agg, fixed splits (up to 16 spread
// over the range, in GPUs), then the planners.
std::vector<std::string> all_policies(int64_t gpus, Widths w);

}  // namespace tandem::planner
