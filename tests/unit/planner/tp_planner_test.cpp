// The planner with tensor-parallel workers: a group's roofline and memory,
// and cells of two widths that a re-split drains and regroups (issue 18).
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <span>

#include <nlohmann/json.hpp>

#include "planner/epoch_planner.h"
#include "planner/fit.h"
#include "planner/policy.h"
#include "planner/simulator.h"

using namespace tandem;
using namespace tandem::planner;

namespace {

runtime::ModelConfig llama_70b() {
  std::ifstream f(TANDEM_SOURCE_DIR "/jobs/sim/llama-70b.json");
  return runtime::ModelConfig::parse(nlohmann::json::parse(f), "llama-70b.json");
}

}  // namespace

TEST_CASE("tensor-parallel workers: the group's roofline, its exchanges and its memory", "[planner][tp]") {
  const auto shape = ModelShape::from(llama_70b());
  const auto h100 = HardwareProfile::named("h100");
  const PerfModel one(shape, h100), two(shape.at_width(2), h100), four(shape.at_width(4), h100), eight(shape.at_width(8), h100);
  // Llama-3-70B in bf16 is ~141 GB: no H100 holds it alone; two do, four hold more than twice their KV.
  CHECK(shape.weight_bytes / 1e9 == Approx(141).epsilon(0.02));
  CHECK(one.kv_capacity_tokens() == 0);
  CHECK(two.kv_capacity_tokens() > 0);
  CHECK(four.kv_capacity_tokens() > 2.5 * two.kv_capacity_tokens());
  // Decode of 64 sequences at 2k context: a wider group is faster, but not in proportion (its exchanges and the
  // whole LM head on every GPU do not split).
  StepLoad decode;
  decode.decode_seqs = 64;
  decode.decode_ctx = 64 * 2048.0;
  decode.logit_rows = 64;
  CHECK(four.step_seconds(decode) < two.step_seconds(decode));
  CHECK(eight.step_seconds(decode) < four.step_seconds(decode));
  CHECK(two.step_seconds(decode) / four.step_seconds(decode) < 2.0);
  // Two exchanges per layer of the step's hidden states, as a ring all-reduce moves them.
  CHECK(one.exchange_seconds(64) == 0);
  const double ring = 64 * 8192 * 2 * 2.0 * 3 / 4;
  CHECK(four.exchange_seconds(64) == Approx(2 * 80 * (h100.link_latency_s + ring / h100.link_bytes_per_s)));
  CHECK(four.step_seconds(decode) > four.exchange_seconds(64) + h100.step_overhead_s);
  // A group's GPUs send their KV shards at once.
  CHECK(four.transfer_seconds(1000) ==
        Approx(h100.link_latency_s + 1000 * shape.kv_bytes_per_token / (4 * h100.link_bytes_per_s)));
  // Widths the heads allow: 64 heads and 8 KV heads take 1, 2, 4, 8; nothing else.
  CHECK(shape.width_problem(8).empty());
  CHECK_THAT(shape.width_problem(3), Catch::Contains("1, 2, 4 or 8"));
  ModelShape odd = shape;
  odd.heads = 6;
  CHECK_THAT(odd.width_problem(4), Catch::Contains("does not divide the model's 6 attention heads"));
}

namespace {

// Prefill workers of width 4 and decode workers of width 2 on 16 H100s: cells
// of 4 GPUs, each one prefill worker or two decode workers.
struct MixedCells {
  ModelShape shape = ModelShape::from(llama_70b());
  PerfModel four{shape.at_width(4), HardwareProfile::named("h100")};
  PerfModel two{shape.at_width(2), HardwareProfile::named("h100")};
  std::vector<Cell> cells{4, two_width_cell(&four, 4, &two, 2)};
};

// A different split for each epoch, in cells.
class Sequence : public Policy {
 public:
  explicit Sequence(std::vector<Split> splits) : splits_(std::move(splits)) {}
  std::string name() const override { return "sequence"; }
  Split choose(const EpochView& e, const PlanContext&, double& predicted) override {
    predicted = 0;
    return splits_[static_cast<std::size_t>(e.index) % splits_.size()];
  }

 private:
  std::vector<Split> splits_;
};

}  // namespace

// Issue 18: a re-split may change widths. A cell runs either form, never both:
// its decode workers drain before its GPUs become a prefill worker, and back.
TEST_CASE("cells of two widths: a re-split drains a cell's workers, then regroups its GPUs", "[planner][tp]") {
  MixedCells m;
  // The estimate of a split of cells is the estimate of the workers it makes.
  const auto reqs = WorkloadSpec::load(TANDEM_SOURCE_DIR "/jobs/sim/shifting.toml").generate(40960);
  const std::span<const Request> epoch(reqs.data(), 2000);
  SimOptions o;
  o.workers = 4;
  const PlanContext cells{&o, m.cells};
  SimOptions ow;
  ow.workers = 7;
  const PlanContext workers{&ow, worker_cells({&m.four, &m.two, &m.two, &m.two, &m.two, &m.two, &m.two})};
  CHECK(estimate_epoch_seconds(epoch, Split{1, 3}, cells) == estimate_epoch_seconds(epoch, Split{1, 6}, workers));
  SimOptions oa;
  oa.workers = 8;
  const PlanContext agg{&oa, worker_cells(std::vector<const PerfModel*>(8, &m.two))};
  CHECK(estimate_epoch_seconds(epoch, Split{0, 4}, cells) == estimate_epoch_seconds(epoch, Split{0, 8}, agg));

  // A fixed split of cells runs as the same workers placed once (the cells regroup at the start, empty).
  std::vector<Request> some(reqs.begin(), reqs.begin() + 600);
  for (std::size_t i = 300; i < some.size(); ++i) some[i] = reqs[4000 + i];  // then long answers
  o.epoch_requests = ow.epoch_requests = 300;
  Sequence fixed_cells({Split{1, 3}}), fixed_workers({Split{1, 6}});
  const SimResult a = Simulator(o, m.cells).run(some, fixed_cells);
  const SimResult b = Simulator(ow, workers.cells).run(some, fixed_workers);
  CHECK(a.makespan_s == b.makespan_s);
  CHECK(a.ttft_p99_s == b.ttft_p99_s);

  // Re-split every epoch: agg, 2 prefill cells, 1, agg. At no time do a cell's
  // two forms run at once (GPUs in use <= 16), and every request finishes once.
  Sequence moving({Split{0, 4}, Split{2, 2}, Split{1, 3}, Split{0, 4}});
  o.epoch_requests = 150;
  o.max_num_seqs = 8;  // the router's window (2 x 8 x decode workers) holds less than an epoch: epochs follow in time
  const SimResult r = Simulator(o, m.cells).run(some, moving);
  CHECK(r.requests == 600);
  double out = 0;
  for (const auto& q : some) out += static_cast<double>(q.osl);
  CHECK(r.output_tokens == out);
  REQUIRE(r.epochs.size() == 4);
  bool saw_two_prefill = false, saw_regrouping = false;
  for (const auto& s : r.timeline) {
    const int64_t gpus = 4 * s.prefill + 2 * (s.decode + s.agg);
    CHECK(gpus <= 16);
    saw_two_prefill = saw_two_prefill || s.prefill == 2;
    saw_regrouping = saw_regrouping || gpus < 16;  // a drained worker's GPUs wait for the rest of its cell
  }
  CHECK(saw_two_prefill);
  CHECK(saw_regrouping);
  CHECK(r.timeline.back().agg == 8);

  // Regrouped GPUs copy their new shard in first (each GPU's weights over reload_bytes_per_s): ~35 GB at width 4.
  CHECK(m.four.reload_seconds() == Approx(m.four.gpu_weight_bytes() / 32e9));
  CHECK(m.four.gpu_weight_bytes() / 1e9 == Approx(36.3).epsilon(0.02));
  HardwareProfile instant = HardwareProfile::named("h100");
  instant.reload_bytes_per_s = 1e30;
  const PerfModel four_now(m.shape.at_width(4), instant), two_now(m.shape.at_width(2), instant);
  const std::vector<Cell> cells_now(4, Cell{{&four_now}, {&two_now, &two_now}});
  Sequence again({Split{0, 4}, Split{2, 2}, Split{1, 3}, Split{0, 4}});
  const SimResult free_reload = Simulator(o, cells_now).run(some, again);
  CHECK(free_reload.makespan_s < r.makespan_s);
}

// A job's planner with two widths (a re-split that changes widths in `tandem
// run`): the splits of cells the simulator's policies make, and each width's
// model fitted to the steps its own workers measured.
TEST_CASE("the epoch planner with two widths: splits of cells, each width fitted to its own workers' steps",
          "[planner][tp]") {
  MixedCells m;
  REQUIRE(m.cells[0].prefill.size() == 1);  // two_width_cell: one worker of 4, or two of 2
  REQUIRE(m.cells[0].decode.size() == 2);
  const auto reqs = WorkloadSpec::load(TANDEM_SOURCE_DIR "/jobs/sim/shifting.toml").generate(40960);
  const std::span<const Request> epoch(reqs.data(), 300);
  SimOptions o;
  o.workers = 4;  // cells
  o.epoch_requests = 300;
  const auto h100 = HardwareProfile::named("h100");
  EpochPlanner two(o, m.shape, 4, 2, h100, "lookahead");
  // Its first decision is the lookahead policy's over the same cells.
  const std::vector<EpochRecord> none;
  EpochView view;
  view.requests = epoch;
  view.history = &none;
  view.current = {0, 4};
  double predicted = 0;
  const Split want = make_policy("lookahead", 4)->choose(view, PlanContext{&o, m.cells}, predicted);
  const auto d = two.decide(epoch);
  CHECK(d.split == want);
  CHECK(d.predicted_s == predicted);
  // At one width the two-width planner is the one-width planner of that width.
  EpochPlanner same(o, m.shape, 2, 2, h100, "lookahead"), one(o, m.shape.at_width(2), h100, "lookahead");
  const auto a = same.decide(epoch), b = one.decide(epoch);
  CHECK(a.split == b.split);
  CHECK(a.predicted_s == b.predicted_s);

  // Steps of the prefill workers (width 4) that took twice what the model says refit that width alone.
  std::vector<StepSample> slow;
  for (int i = 0; i < 40; ++i) {
    StepLoad load;
    load.prefill_tokens = 256.0 * (1 + i % 8);
    load.prefill_ctx = load.prefill_tokens * load.prefill_tokens / 2;
    load.logit_rows = 1;
    slow.push_back({load, 2 * m.four.step_seconds(load)});
  }
  two.observe(slow, 4);
  two.refit();
  CHECK(two.fit_at(4).samples == 40);
  CHECK(two.fit_at(2).samples == 0);  // the decode width keeps its profile
  const double base_rate = h100.peak_flops * h100.mfu;
  CHECK(two.fit_at(4).profile.peak_flops * two.fit_at(4).profile.mfu < 0.75 * base_rate);
  // And plans with it: two prefill cells of the same epoch take longer than before the steps were seen.
  EpochPlanner fresh(o, m.shape, 4, 2, h100, "static:2:2"), fitted(o, m.shape, 4, 2, h100, "static:2:2");
  fitted.observe(slow, 4);
  CHECK(fitted.decide(epoch).predicted_s > fresh.decide(epoch).predicted_s);
}

TEST_CASE("8-bit weights count a byte each: an FP8 70B fits one H100 with room for KV, and a step reads half",
          "[planner][tp]") {
  auto config = llama_70b();
  const auto bf16 = ModelShape::from(config);
  config.quant.method = runtime::QuantConfig::Method::kFp8Block;  // as a checkpoint's quantization_config says
  const auto fp8 = ModelShape::from(config);
  auto at_load = llama_70b();
  at_load.load_as = "int8";  // or model.dtype quantizing as it loads
  CHECK(ModelShape::from(at_load).weight_bytes == fp8.weight_bytes);
  CHECK(fp8.linear_bytes_per_param == 1);
  CHECK(fp8.weight_bytes == Approx((bf16.weight_bytes - 2 * bf16.lm_head_params) / 2 + 2 * bf16.lm_head_params));
  const auto h100 = HardwareProfile::named("h100");
  CHECK(PerfModel(bf16, h100).kv_capacity_tokens() == 0);  // 141 GB of bf16 weights on 80 GB
  CHECK(PerfModel(fp8, h100).kv_capacity_tokens() > 10000);
  StepLoad decode;
  decode.decode_seqs = 1;
  decode.logit_rows = 1;
  CHECK(PerfModel(fp8, h100).work(decode).second < 0.55 * PerfModel(bf16, h100).work(decode).second);
}

TEST_CASE("a mixture of experts: flops from the active experts, memory from all, a step's bytes from those it touches",
          "[planner][tp][moe]") {
  std::ifstream f(TANDEM_SOURCE_DIR "/jobs/sim/qwen3-30b-a3b.json");
  const auto config = runtime::ModelConfig::parse(nlohmann::json::parse(f), "qwen3-30b-a3b.json");
  const auto shape = ModelShape::from(config);
  const auto h100 = HardwareProfile::named("h100");
  // Qwen3-30B-A3B: 30.5 B parameters (61 GB in bf16, the untied embedding only looked up), 3.3 B active a
  // token counting the embedding as Qwen does.
  CHECK(shape.weight_bytes / 1e9 == Approx(61).epsilon(0.02));
  CHECK((shape.matmul_params + 2 * shape.lm_head_params) / 1e9 == Approx(3.3).epsilon(0.03));
  CHECK(shape.moe_layers == 48);
  // Experts a step reads per layer: k for one token, E (1 - (1 - k/E)^T) for T, all of them at last.
  CHECK(shape.experts_touched(1) == Approx(8));
  CHECK(shape.experts_touched(16) == Approx(128 * (1 - std::pow(1 - 8.0 / 128, 16))));
  CHECK(shape.experts_touched(4096) == Approx(128).epsilon(1e-6));
  // A one-sequence decode step reads the active weights, not the 61 GB: a dense model of the same
  // weights would take about 61 / 3.3 times as long.
  const PerfModel one(shape, h100);
  StepLoad decode;
  decode.decode_seqs = 1;
  decode.decode_ctx = 1024;
  decode.logit_rows = 1;
  const double active_bytes = (shape.matmul_params + shape.lm_head_params) * 2;
  CHECK(one.work(decode).second == Approx(active_bytes + shape.kv_bytes_per_token * 1025).epsilon(1e-6));
  // 256 sequences touch nearly every expert: the step reads nearly every weight.
  decode.decode_seqs = 256;
  decode.decode_ctx = 256 * 1024.0;
  decode.logit_rows = 256;
  CHECK(one.work(decode).second > 0.99 * shape.weight_bytes);
  // At width 4, expert parallel: 32 experts a GPU, a quarter of the memory; the combine moves less than
  // the split experts' all-reduce of every slot (k = 8 outputs a token).
  const PerfModel ep(shape.at_width(4), h100);
  ModelShape split_shape = shape.at_width(4);
  split_shape.expert_parallel = false;
  const PerfModel split(split_shape, h100);
  CHECK(ep.gpu_weight_bytes() == Approx((shape.weight_bytes - shape.lm_head_params * 2) / 4 + shape.lm_head_params * 2));
  CHECK(ep.exchange_seconds(512) < split.exchange_seconds(512));
  const double row = 512 * 2048 * 2.0, one_link = h100.link_latency_s + row * 2 * 3 / 4 / h100.link_bytes_per_s;
  CHECK(ep.exchange_seconds(512) ==
        Approx(48 * one_link + 48 * (2 * h100.link_latency_s + (row * 8 * 3 / 16 + row * 3 / 4) / h100.link_bytes_per_s)));
  // Widths: 128 experts take 1-8 whole; a model of 6 experts refuses 4 with expert parallelism.
  CHECK(shape.width_problem(8).empty());
  ModelShape six = shape;
  six.experts = 6;
  CHECK_THAT(six.width_problem(4), Catch::Contains("does not divide the model's 6 experts"));
  six.expert_parallel = false;
  CHECK(six.width_problem(4).empty());
}
