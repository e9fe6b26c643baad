#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "planner/policy.h"
#include "planner/simulator.h"
#include "router/dispatcher.h"

using namespace tandem;
using namespace tandem::planner;

namespace {

runtime::ModelConfig sim_config(const std::string& name) {
  std::ifstream f(TANDEM_SOURCE_DIR "/jobs/sim/" + name);
  return runtime::ModelConfig::parse(nlohmann::json::parse(f), name);
}
runtime::ModelConfig qwen3_8b() { return sim_config("qwen3-8b.json"); }

struct Cluster {
  PerfModel model;
  std::vector<const PerfModel*> workers;
  explicit Cluster(int64_t n, const std::string& hw = "h100")
      : model(ModelShape::from(qwen3_8b()), HardwareProfile::named(hw)), workers(static_cast<std::size_t>(n), &model) {}
};

std::filesystem::path temp_file(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p;
}

SimResult simulate(const std::vector<Request>& reqs, const std::string& policy, int64_t gpus, int64_t epoch,
                   double ttft_s = 0, double itl_s = 0) {
  Cluster c(gpus);
  SimOptions o;
  o.workers = gpus;
  o.epoch_requests = epoch;
  o.ttft_target_s = ttft_s;
  o.itl_target_s = itl_s;
  Simulator sim(o, c.workers);
  auto p = make_policy(policy, gpus);
  return sim.run(reqs, *p);
}

}  // namespace

TEST_CASE("the roofline: decode is bound by memory, prefill by compute", "[planner]") {
  Cluster c(1);
  const PerfModel& m = c.model;
  const auto& hw = m.hardware();
  StepLoad one;
  one.decode_seqs = 1;
  one.decode_ctx = 100;
  one.logit_rows = 1;
  const double weights_s = m.shape().weight_bytes / (hw.hbm_bytes_per_s * hw.mbu);
  CHECK(m.step_seconds(one) == Approx(weights_s + hw.step_overhead_s).epsilon(0.01));
  StepLoad big;
  big.prefill_tokens = 8192;
  big.prefill_ctx = 8192 * 4096.5;
  big.logit_rows = 1;
  const double compute_s = (2 * m.shape().matmul_params * 8192 + m.shape().attn_flops_per_ctx * big.prefill_ctx +
                            2 * m.shape().lm_head_params) / (hw.peak_flops * hw.mfu);
  CHECK(m.step_seconds(big) == Approx(compute_s + hw.step_overhead_s).epsilon(1e-9));
  // Qwen3-8B in bf16 is ~16 GB; its KV is 144 KiB per token.
  CHECK(m.shape().weight_bytes / 1e9 == Approx(15.1).epsilon(0.02));
  CHECK(m.shape().kv_bytes_per_token == 2 * 36 * 8 * 128 * 2);
  CHECK(m.transfer_seconds(1000) == Approx(hw.link_latency_s + 1000 * m.shape().kv_bytes_per_token / hw.link_bytes_per_s));
  CHECK(m.kv_capacity_tokens() > 300000);
}

TEST_CASE("workload files: phases, distributions, one clear error", "[planner]") {
  const auto ok = temp_file("tandem_wl_ok.toml", R"(seed = 9
[[phase]]
requests = 20000
isl = { dist = "lognormal", mean = 1000, sigma = 0.5 }
osl = { dist = "uniform", min = 10, max = 30 }
[[phase]]
requests = 100
isl = { dist = "fixed", value = 64 }
osl = { dist = "fixed", value = 8 }
shared_prefix_tokens = 32
arrival = { rate = 10.0 }
)");
  const auto w = WorkloadSpec::load(ok);
  const auto a = w.generate(32768), b = w.generate(32768);
  REQUIRE(a.size() == 20100);
  CHECK(a[123].isl == b[123].isl);  // same seed, same requests
  double isl = 0;
  for (std::size_t i = 0; i < 20000; ++i) isl += static_cast<double>(a[i].isl);
  CHECK(isl / 20000 == Approx(1000).epsilon(0.03));  // lognormal with the asked mean
  CHECK(a[0].arrival_s == 0);
  CHECK(a[20099].arrival_s > 5);  // Poisson at 10/s: ~10 s for 100
  CHECK(a[20050].prefix_group == 1);
  CHECK(a[20050].prefix_tokens == 32);
  auto error_of = [](const std::string& text) {
    try {
      WorkloadSpec::load(temp_file("tandem_wl_bad.toml", text));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of("seed = 1\n").find("no [[phase]]") != std::string::npos);
  CHECK(error_of("[[phase]]\nrequests = 5\nisl = { dist = \"zipf\" }\nosl = { dist = \"fixed\", value = 1 }\n")
            .find(":3: isl: dist must be") != std::string::npos);
  CHECK(error_of("[[phase]]\nrequests = 5\nisl = { dist = \"fixed\", value = 3 }\nosl = { dist = \"fixed\", value = 1 }\n"
                 "colour = 1\n").find("unknown key 'colour'") != std::string::npos);
}

TEST_CASE("every request finishes once, and no faster than the hardware allows", "[planner]") {
  const auto spec = WorkloadSpec::load(TANDEM_SOURCE_DIR "/jobs/sim/shifting.toml");
  const auto reqs = spec.generate(40960);
  for (const std::string policy : {"agg", "static:3:5", "lookahead"}) {
    const auto r = simulate(reqs, policy, 8, 4000);
    INFO(policy);
    CHECK(r.requests == static_cast<int64_t>(reqs.size()));
    double out = 0;
    for (const auto& q : reqs) out += static_cast<double>(q.osl);
    CHECK(r.output_tokens == out);
    CHECK(r.ttft_p50_s > 0);
    CHECK(r.epochs.size() == 3);
    // A lower bound: reading the weights once per generated token of the longest request.
    Cluster c(1);
    int64_t longest = 0;
    for (const auto& q : reqs) longest = std::max(longest, q.osl);
    CHECK(r.makespan_s > static_cast<double>(longest) * c.model.shape().weight_bytes /
                             (c.model.hardware().hbm_bytes_per_s * c.model.hardware().mbu));
  }
}

// The issue's bar, kept as a test with fixed seeds: on a stationary and a
// shifting workload, lookahead is within 5% of the oracle, never more than 1%
// worse than the best fixed configuration, and beats sla where the mix shifts.
TEST_CASE("lookahead against the oracle, every fixed split and sla", "[planner]") {
  for (const std::string name : {"stationary", "shifting"}) {
    const auto reqs = WorkloadSpec::load(TANDEM_SOURCE_DIR "/jobs/sim/" + name + ".toml").generate(40960);
    const int64_t gpus = 8, epoch = 4000;
    double best_fixed = 1e30;
    for (const Split& s : all_splits(gpus)) {
      const std::string p = s.agg() ? "agg" : "static:" + std::to_string(s.prefill) + ":" + std::to_string(s.decode);
      best_fixed = std::min(best_fixed, simulate(reqs, p, gpus, epoch).makespan_s);
    }
    const double look = simulate(reqs, "lookahead", gpus, epoch).makespan_s;
    const double oracle = simulate(reqs, "oracle", gpus, epoch).makespan_s;
    const double sla = simulate(reqs, "sla", gpus, epoch).makespan_s;
    INFO(name << ": lookahead " << look << " s, oracle " << oracle << " s, best fixed " << best_fixed << " s, sla " << sla << " s");
    CHECK(look <= oracle * 1.05);
    CHECK(look <= best_fixed * 1.01);
    if (name == "shifting") CHECK(look < sla);
  }
}

// Under targets the measure is goodput (requests meeting both, per second),
// on a stationary and on a shifting mix arriving over time. On the stationary
// one (40/s, TTFT 2 s, ITL 12 ms; a Qwen3-8B decode step alone is ~6.6 ms on
// an H100 in this model) aggregated mode's co-batched prompt chunks break the
// ITL target for most requests and a 3P:5D split meets it for almost all. At
// 15 ms both meet it: where disaggregation pays depends on the target.
TEST_CASE("lookahead under TTFT and ITL targets: goodput against the oracle, fixed splits and sla", "[planner]") {
  struct Case {
    const char* file;
    int64_t epoch;
    double ttft, itl;
    bool disagg_pays;
  };
  const Case cases[] = {{"steady_arrivals", 2000, 2.0, 0.012, true}, {"shifting_arrivals", 1500, 2.0, 0.020, false}};
  for (const Case& c : cases) {
    const auto reqs = WorkloadSpec::load(std::string(TANDEM_SOURCE_DIR "/jobs/sim/") + c.file + ".toml").generate(40960);
    const int64_t gpus = 8;
    double best_fixed = 0, agg = 0;
    for (const Split& s : all_splits(gpus)) {
      const std::string p = s.agg() ? "agg" : "static:" + std::to_string(s.prefill) + ":" + std::to_string(s.decode);
      const double g = simulate(reqs, p, gpus, c.epoch, c.ttft, c.itl).goodput_per_s();
      best_fixed = std::max(best_fixed, g);
      if (s.agg()) agg = g;
    }
    const double look = simulate(reqs, "lookahead", gpus, c.epoch, c.ttft, c.itl).goodput_per_s();
    const double oracle = simulate(reqs, "oracle", gpus, c.epoch, c.ttft, c.itl).goodput_per_s();
    const double sla = simulate(reqs, "sla", gpus, c.epoch, c.ttft, c.itl).goodput_per_s();
    INFO(c.file << " goodput req/s: lookahead " << look << ", oracle " << oracle << ", best fixed " << best_fixed
                << ", agg " << agg << ", sla " << sla);
    CHECK(look >= oracle * 0.95);
    CHECK(look >= best_fixed * 0.99);
    CHECK(look > sla);
    if (c.disagg_pays) CHECK(best_fixed > agg * 2);  // where disaggregation pays, in this model
  }
}

namespace {

// Every split simulated, as the oracle did before it searched: the reference
// the oracle's search is held to.
class ScanEverySplit : public Policy {
 public:
  std::string name() const override { return "scan"; }
  Split choose(const EpochView& e, const PlanContext& ctx, double& predicted) override {
    const auto n = ctx.size();
    Split best{0, n};
    predicted = std::numeric_limits<double>::infinity();
    for (const Split& s : all_splits(n)) {
      const double t = e.evaluate(s, predicted);
      if (t < predicted) best = s, predicted = t;
    }
    return best;
  }
};

// Counts the simulations a policy asks for, and keeps its choices.
class CountSimulations : public Policy {
 public:
  explicit CountSimulations(std::unique_ptr<Policy> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  Split choose(const EpochView& e, const PlanContext& ctx, double& predicted) override {
    EpochView counted = e;
    counted.evaluate = [this, &e](const Split& s, double give_up_above) {
      ++simulations;
      return e.evaluate(s, give_up_above);
    };
    chosen.push_back(inner_->choose(counted, ctx, predicted));
    return chosen.back();
  }
  int64_t simulations = 0;
  std::vector<Split> chosen;

 private:
  std::unique_ptr<Policy> inner_;
};

}  // namespace

// What the oracle's search rests on: a copy of the run costs the whole run, so
// a split kept from one epoch to the next costs the same at both; and a copy
// that gives up does so only above its bound, with an answer above it.
TEST_CASE("the oracle's look-ahead copies: a kept split keeps its cost, and giving up is exact", "[planner]") {
  class Probe : public Policy {
   public:
    std::string name() const override { return "probe"; }
    Split choose(const EpochView& e, const PlanContext&, double& predicted) override {
      const double kept = e.evaluate(keep, std::numeric_limits<double>::infinity());
      if (e.index > 0) CHECK(kept == last);
      last = kept;
      const double other = e.evaluate(Split{0, 8}, std::numeric_limits<double>::infinity());
      CHECK(e.evaluate(Split{0, 8}, other) == other);  // at its bound: exact
      const double below = other - 0.1 * std::abs(other);
      const double gave_up = e.evaluate(Split{0, 8}, below);
      CHECK(gave_up > below);
      CHECK(gave_up <= other);
      ++epochs;
      predicted = 0;
      return keep;
    }
    Split keep{3, 5};
    double last = 0;
    int epochs = 0;
  };
  const auto reqs = WorkloadSpec::load(TANDEM_SOURCE_DIR "/jobs/sim/shifting_arrivals.toml").generate(40960);
  for (const double itl : {0.0, 0.020}) {  // makespan; goodput under targets
    Cluster c(8);
    SimOptions o;
    o.workers = 8;
    o.epoch_requests = 1500;
    o.ttft_target_s = itl > 0 ? 2.0 : 0;
    o.itl_target_s = itl;
    Simulator sim(o, c.workers);
    Probe probe;
    sim.run(reqs, probe);
    CHECK(probe.epochs == 6);
  }
}

// The oracle's search over the prefill count, on cost landscapes given as
// tables (a policy is a value): the scan's split in a few simulations, with
// ties going to agg, then to fewer prefill workers, as the scan breaks them.
TEST_CASE("the oracle finds a landscape's best split in a few simulations an epoch", "[planner]") {
  const int64_t n = 64;
  Cluster c(n);
  SimOptions o;
  o.workers = n;
  const PlanContext ctx{&o, worker_cells(c.workers)};
  auto oracle = make_policy("oracle", n);
  std::vector<EpochRecord> history;
  Split current{0, n};
  auto epoch = [&](int64_t index, const std::function<double(int64_t)>& landscape, int64_t& simulations) {
    EpochView e;
    e.index = index;
    e.history = &history;
    e.current = current;
    simulations = 0;
    e.evaluate = [&](const Split& s, double) {
      ++simulations;
      return landscape(s.prefill);
    };
    double predicted = 0;
    current = oracle->choose(e, ctx, predicted);
    return current;
  };
  int64_t sims = 0;
  // A valley at P = 40, agg far above it: the first epoch walks there from P = 1
  // (no requests, so the lookahead estimate, where a first search starts, prefers none).
  auto valley = [](int64_t best, double bottom) {
    return [best, bottom](int64_t p) { return p == 0 ? 5000.0 : bottom + static_cast<double>((p - best) * (p - best)); };
  };
  CHECK(epoch(0, valley(40, 100), sims) == Split{40, 24});
  CHECK(sims <= 16);
  // The same valley: the split in place costs what it did; its neighbours and agg are checked.
  CHECK(epoch(1, valley(40, 100), sims) == Split{40, 24});
  CHECK(sims <= 3);
  // The valley moves (the kept split's cost stays what it was, as in a run): the walk follows.
  CHECK(epoch(2, valley(47, 51), sims) == Split{47, 17});
  CHECK(sims <= 12);
  // A flat floor from P = 20 to 40: the scan would take P = 20, the fewest prefill workers.
  current = Split{0, n};
  auto floor = [](int64_t p) { return p == 0 ? 5000.0 : std::max(10.0, std::abs(static_cast<double>(p) - 30.0)); };
  CHECK(epoch(10, floor, sims) == Split{20, 44});
  CHECK(sims <= 16);
  // Agg is best: it is taken.
  current = Split{0, n};
  auto agg_best = [](int64_t p) { return p == 0 ? 1.0 : 100.0 + static_cast<double>(p); };
  CHECK(epoch(20, agg_best, sims) == Split{0, n});
}

// Against the scan of every split with the true simulator, where the scan is
// cheap: the same splits, hence the same run, for a third of the simulations
// or fewer. (docs/planner.md gives the larger cases, where the search can
// miss a better split in another valley.)
TEST_CASE("the oracle's search against the scan of every split", "[planner]") {
  struct Case {
    std::filesystem::path workload;
    int64_t gpus, epoch;
    double ttft, itl;
  };
  const auto steady = temp_file("tandem_oracle_steady.toml", R"(seed = 8
[[phase]]
requests = 10000
isl = { dist = "lognormal", mean = 3000, sigma = 0.5 }
osl = { dist = "lognormal", mean = 300, sigma = 0.4 }
arrival = { rate = 80.0 }
)");
  const Case cases[] = {{TANDEM_SOURCE_DIR "/jobs/sim/shifting.toml", 12, 1024, 0, 0},
                        {TANDEM_SOURCE_DIR "/jobs/sim/stationary.toml", 16, 1024, 0, 0},
                        {steady, 16, 1024, 2.0, 0.012}};
  for (const Case& k : cases) {
    const auto reqs = WorkloadSpec::load(k.workload).generate(40960);
    Cluster c(k.gpus);
    SimOptions o;
    o.workers = k.gpus;
    o.epoch_requests = k.epoch;
    o.ttft_target_s = k.ttft;
    o.itl_target_s = k.itl;
    Simulator sim(o, c.workers);
    CountSimulations search(make_policy("oracle", k.gpus)), scan(std::make_unique<ScanEverySplit>());
    const SimResult a = sim.run(reqs, search), b = sim.run(reqs, scan);
    INFO(k.workload.filename().string() << " on " << k.gpus << " GPUs: " << search.simulations << " simulations against " << scan.simulations);
    CHECK(search.chosen == scan.chosen);
    CHECK(a.makespan_s == b.makespan_s);
    CHECK(a.good_requests == b.good_requests);
    CHECK(search.simulations * 3 <= scan.simulations);
  }
}

TEST_CASE("heterogeneous workers: prefill roles go to the fastest GPUs, wherever they are listed", "[planner]") {
  const auto reqs = WorkloadSpec::load(TANDEM_SOURCE_DIR "/jobs/sim/stationary.toml").generate(40960);
  const auto shape = ModelShape::from(qwen3_8b());
  const PerfModel h100(shape, HardwareProfile::named("h100")), b200(shape, HardwareProfile::named("b200"));
  SimOptions o;
  o.workers = 8;
  o.epoch_requests = 4000;
  // Every long prompt to the prefill workers, however long their queue: the
  // GPUs' speed is what is measured here, not the saturation rule (which,
  // counted in tokens, sends this workload's overflow to the decode workers
  // and hides the prefill GPUs' speed).
  o.prefill_saturation_tokens = int64_t{1} << 40;
  auto run = [&](std::vector<const PerfModel*> w) {
    Simulator sim(o, std::move(w));
    auto p = make_policy("static:2:6", 8);
    return sim.run(reqs, *p).makespan_s;
  };
  const double first = run({&b200, &b200, &h100, &h100, &h100, &h100, &h100, &h100});
  const double last = run({&h100, &h100, &h100, &h100, &h100, &h100, &b200, &b200});
  const double all_h100 = run(std::vector<const PerfModel*>(8, &h100));
  CHECK(first == last);
  CHECK(first < all_h100 * 0.9);  // compute-dense prefill GPUs (Splitwise's point) pay
}

TEST_CASE("policies by name; bad names and splits are one clear error", "[planner]") {
  CHECK(make_policy("static:2:6", 8)->name() == "static:2:6");
  CHECK(make_policy("agg", 8)->name() == "agg");
  CHECK_THROWS_WITH(make_policy("static:3:3", 8), Catch::Contains("add up to the 8 workers"));
  CHECK_THROWS_WITH(make_policy("static:x:y", 8), Catch::Contains("static:P:D"));
  CHECK_THROWS_WITH(make_policy("best", 8), Catch::Contains("unknown policy 'best'"));
  CHECK(all_splits(4).size() == 4);
  CHECK(all_splits(4)[0].agg());
  CHECK(all_splits(4)[3].name() == "3P:1D");
}

TEST_CASE("a GPU's device name picks its built-in profile", "[planner]") {
  using tandem::planner::HardwareProfile;
  CHECK(HardwareProfile::builtin_for_device("NVIDIA H100 80GB HBM3") == "h100");
  CHECK(HardwareProfile::builtin_for_device("NVIDIA H200") == "h200");
  CHECK(HardwareProfile::builtin_for_device("NVIDIA B200") == "b200");
  CHECK(HardwareProfile::builtin_for_device("NVIDIA A100-SXM4-80GB").empty());
  CHECK(HardwareProfile::builtin_for_device("").empty());
  CHECK(HardwareProfile::named(HardwareProfile::builtin_for_device("NVIDIA H200")).hbm_bytes_per_s == 4.8e12);
}

namespace {

// The job's workers as the dispatcher sees them, recording what it sends.
class RecordingLink : public router::WorkerLink {
 public:
  RecordingLink(std::vector<int> decode, std::vector<int> prefill) : decode_(std::move(decode)), prefill_(std::move(prefill)) {}
  std::vector<int> workers() const override { return decode_; }
  std::vector<int> prefill_workers() const override { return prefill_; }
  void submit(int worker, const service::WireRequest& r) override { sent.emplace_back(worker, r.prefill_rank); }
  void cancel(int, uint64_t) override {}
  void poll(router::LinkEvents&) override {}
  std::vector<service::RankReport> shutdown(bool) override { return {}; }
  std::vector<std::pair<int, int>> sent;  // (decode rank, prefill rank or -1)

 private:
  std::vector<int> decode_, prefill_;
};

}  // namespace

// The job's dispatcher and the simulator call one placement function
// (router::place); fed the same recorded workload from the same state, they
// must place every request alike: decode worker, remote or local prefill,
// saturation.
TEST_CASE("the job and the simulator place a recorded workload identically", "[planner][placement]") {
  // Prompt lengths as a batch file would give them: short ones (prefilled
  // locally), long ones (sent to a prefill worker until it saturates).
  std::vector<Request> reqs;
  for (int i = 0; i < 60; ++i) reqs.push_back({.isl = i % 5 == 0 ? 40 : 200 + (i * 37) % 900, .osl = 20});
  const int64_t local = 64, saturation = 4000, gpus = 4;  // 1 prefill worker, 3 decode

  Cluster c(gpus);
  SimOptions o;
  o.workers = gpus;
  o.epoch_requests = 1000;
  o.max_num_seqs = 64;  // the window holds the whole workload: all of it is placed before anything finishes
  o.local_prefill_tokens = local;
  o.prefill_saturation_tokens = saturation;
  o.record_placements = true;
  Simulator sim(o, c.workers);
  auto policy = make_policy("static:1:3", gpus);
  const SimResult res = sim.run(reqs, *policy);
  REQUIRE(res.placements.size() == reqs.size());

  // The job: rank 1 prefills, ranks 2..4 decode (worker k of the simulator is rank k + 1).
  RecordingLink link({2, 3, 4}, {1});
  router::DispatchOptions d;
  d.block_size = o.block_size;
  d.local_prefill_tokens = local;
  d.prefill_saturation_tokens = saturation;
  router::Dispatcher dispatcher(link, d);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    service::WireRequest w;
    w.id = i;
    w.prompt.assign(static_cast<std::size_t>(reqs[i].isl), static_cast<int32_t>(1000 + i));  // no shared prefixes
    dispatcher.submit(w);
  }
  REQUIRE(link.sent.size() == reqs.size());
  int remote = 0, local_prefills = 0, saturated = 0;
  int64_t queued = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    INFO("request " << i << " of " << reqs[i].isl << " tokens");
    const auto [sim_decode, sim_prefill] = res.placements[i];
    CHECK(link.sent[i].first == sim_decode + 1);
    CHECK(link.sent[i].second == (sim_prefill < 0 ? -1 : sim_prefill + 1));
    if (link.sent[i].second >= 0) ++remote, queued += reqs[i].isl;
    else if (reqs[i].isl < local) ++local_prefills;
    else ++saturated;
  }
  // The workload exercised every rule: remote prefill, short prompts kept local, and a saturated prefill worker.
  CHECK(remote > 0);
  CHECK(local_prefills > 0);
  CHECK(saturated > 0);
  CHECK(queued >= saturation);
}
