// `tandem simulate`: a Tandem job on a simulated cluster (planner/), for
// choosing a split or a policy before spending GPU hours, and for seeing
// where disaggregation pays.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "launcher/commands.h"
#include "planner/cluster.h"
#include "planner/policy.h"
#include "planner/simulator.h"

namespace tandem::launcher {
namespace {

using planner::Cluster;
using planner::Widths;

struct SimulateOptions {
  std::string workload, trace, model_config, hardware = "h100", policy = "lookahead", plot, tp;
  int64_t gpus = 8;
  planner::SimOptions sim;
  double ttft_ms = 0, itl_ms = 0;
  bool json = false;
};

// "h100" or "b200:2,h100:6" (kinds and counts, adding up to --gpus).
std::vector<planner::HardwareProfile> hardware_list(const std::string& spec, int64_t gpus) {
  std::vector<planner::HardwareProfile> out;
  if (spec.find(':') == std::string::npos || std::filesystem::exists(spec)) {
    const auto h = planner::HardwareProfile::named(spec);
    out.assign(static_cast<std::size_t>(gpus), h);
    return out;
  }
  std::stringstream ss(spec);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const auto colon = part.rfind(':');
    int64_t n = 0;
    try {
      n = colon == std::string::npos ? 0 : std::stoll(part.substr(colon + 1));
    } catch (const std::exception&) {
    }
    if (n < 1) throw Error("--hardware '" + spec + "': write KIND:COUNT[,KIND:COUNT...], e.g. b200:2,h100:6");
    const auto h = planner::HardwareProfile::named(part.substr(0, colon));
    for (int64_t i = 0; i < n; ++i) out.push_back(h);
  }
  if (static_cast<int64_t>(out.size()) != gpus)
    throw Error("--hardware '" + spec + "' names " + std::to_string(out.size()) + " GPUs but --gpus is " +
                std::to_string(gpus));
  return out;
}

// A finished job's requests, from its output: prompt and completion tokens of
// every successful line, in the output's order, all known at once.
std::vector<planner::Request> trace_requests(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot read the trace (a tandem run output file)");
  std::vector<planner::Request> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(f, line)) {
    ++n;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("response")) throw Error(path + ":" + std::to_string(n) + ": not an output line");
    const auto& r = j["response"];
    if (r.value("status_code", 0) != 200) continue;
    const auto& u = r["body"]["usage"];
    out.push_back({u["prompt_tokens"].get<int64_t>(), u["completion_tokens"].get<int64_t>(), 0, 0, -1});
  }
  if (out.empty()) throw Error(path + ": no successful requests to replay");
  return out;
}

// The split and the output throughput over (virtual) time, as a PNG drawn by
// gnuplot (Debian's gnuplot-nox; `make setup` installs it).
void plot(const std::string& file, const std::string& title, const planner::SimResult& r) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0)
    throw Error("--plot needs gnuplot: apt install gnuplot-nox (make setup installs it)");
  const auto dir = std::filesystem::temp_directory_path() / ("tandem-plot-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream d(dir / "timeline.dat");
    for (const auto& s : r.timeline)
      d << s.t << " " << s.prefill << " " << s.decode << " " << s.agg << " " << s.output_tokens_per_s << "\n";
    std::ofstream g(dir / "plot.gp");
    g << "set terminal pngcairo size 1000,600 noenhanced\n"
      << "set output '" << file << "'\n"
      << "set title '" << title << "'\n"
      << "set xlabel 'time (s)'\nset ylabel 'workers'\nset y2label 'output tokens/s'\n"
      << "set ytics nomirror\nset y2tics\nset key outside bottom center horizontal\nset grid\n"
      << "plot '" << (dir / "timeline.dat").string() << "' using 1:2 with steps lw 2 title 'prefill', "
      << "'' using 1:3 with steps lw 2 title 'decode', '' using 1:4 with steps lw 2 title 'aggregated', "
      << "'' using 1:5 axes x1y2 with lines lw 1 title 'output tokens/s'\n";
  }
  const std::string cmd = "gnuplot '" + (dir / "plot.gp").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::filesystem::remove_all(dir);
  if (rc != 0 || !std::filesystem::exists(file)) throw Error(file + ": gnuplot could not write the plot");
}

// --tp: "" (the smallest that fits), "best" (the fastest, simulated), "W" or "P:D".
Widths parse_tp(const std::string& spec) {
  if (spec.empty() || spec == "best") return {};
  const auto colon = spec.find(':');
  Widths w;
  try {
    w.prefill = std::stoi(spec.substr(0, colon));
    w.decode = colon == std::string::npos ? w.prefill : std::stoi(spec.substr(colon + 1));
  } catch (const std::exception&) {
    throw Error("--tp '" + spec + "': write a width (4), prefill:decode widths (4:2), or best");
  }
  return w;
}

nlohmann::json result_json(const std::string& policy, const planner::SimResult& r, const Cluster& c) {
  nlohmann::json epochs = nlohmann::json::array();
  for (const auto& e : r.epochs) {
    epochs.push_back({{"index", e.index},
                      {"split", c.split_name(e.split)},
                      {"start_s", e.start_s},
                      {"end_s", e.end_s},
                      {"predicted_s", e.predicted_s},
                      {"requests", e.requests},
                      {"mean_isl", e.mean_isl},
                      {"mean_osl", e.mean_osl}});
  }
  return {{"policy", policy},
          {"makespan_s", r.makespan_s},
          {"requests", r.requests},
          {"output_tokens_per_s", r.output_tokens_per_s()},
          {"goodput_requests_per_s", r.goodput_per_s()},
          {"good_requests", r.good_requests},
          {"ttft_ms", {{"p50", r.ttft_p50_s * 1e3}, {"p90", r.ttft_p90_s * 1e3}, {"p99", r.ttft_p99_s * 1e3}}},
          {"itl_ms", {{"p50", r.itl_p50_s * 1e3}, {"p90", r.itl_p90_s * 1e3}, {"p99", r.itl_p99_s * 1e3}}},
          {"epochs", epochs}};
}

void print_result(const SimulateOptions& o, const std::string& name, const Cluster& c, const planner::SimResult& r) {
  std::printf("%lld requests on %lld GPUs (%s) in %s, policy %s\n", static_cast<long long>(r.requests),
              static_cast<long long>(o.gpus), o.hardware.c_str(), c.describe().c_str(), name.c_str());
  std::printf("makespan %.2f s, %.0f output tokens/s, goodput %.2f req/s\n", r.makespan_s, r.output_tokens_per_s(),
              r.goodput_per_s());
  std::printf("TTFT p50/p90/p99 %.0f/%.0f/%.0f ms; ITL p50/p90/p99 %.1f/%.1f/%.1f ms\n", r.ttft_p50_s * 1e3,
              r.ttft_p90_s * 1e3, r.ttft_p99_s * 1e3, r.itl_p50_s * 1e3, r.itl_p90_s * 1e3, r.itl_p99_s * 1e3);
  std::string prev;
  for (const auto& e : r.epochs) {
    const std::string s = c.split_name(e.split);
    std::printf("epoch %lld: %s%s, %lld requests (isl %.0f, osl %.0f), %.2f s (predicted %.2f s)\n",
                static_cast<long long>(e.index), prev.empty() || prev == s ? "" : (prev + " -> ").c_str(), s.c_str(),
                static_cast<long long>(e.requests), e.mean_isl, e.mean_osl, e.end_s - e.start_s, e.predicted_s);
    prev = s;
  }
}

int simulate(const SimulateOptions& o) {
  if (o.workload.empty() == o.trace.empty()) throw Error("give one of --workload W.toml or --trace OUTPUT.jsonl");
  std::filesystem::path cfg = o.model_config;
  if (std::filesystem::is_directory(cfg)) cfg /= "config.json";
  std::ifstream f(cfg);
  if (!f) throw Error(cfg.string() + ": cannot read the model's config.json");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) throw Error(cfg.string() + ": not valid JSON");
  const auto model = runtime::ModelConfig::parse(j, cfg.string());
  const auto shape = planner::ModelShape::from(model);
  const auto hw = hardware_list(o.hardware, o.gpus);
  const auto requests = o.trace.empty() ? planner::WorkloadSpec::load(o.workload).generate(model.max_position_embeddings)
                                        : trace_requests(o.trace);
  planner::SimOptions so = o.sim;
  so.ttft_target_s = o.ttft_ms / 1e3;
  so.itl_target_s = o.itl_ms / 1e3;
  double longest = 0, longest_prompt = 0;
  for (const auto& r : requests) {
    longest = std::max(longest, static_cast<double>(r.isl + r.osl));
    longest_prompt = std::max(longest_prompt, static_cast<double>(r.isl));
  }
  Widths w = parse_tp(o.tp);
  if (w.decode == 0) {
    const bool search = o.tp == "best";
    const std::string chooser = o.policy == "all" ? "lookahead" : o.policy;
    const auto [chosen, tried] =
        planner::choose_widths(chooser, shape, hw, requests, so, longest_prompt, longest, search, o.hardware);
    w = chosen;
    if (!o.json && search) {
      std::printf("tensor-parallel width%s %s%s, chosen by simulating %s at each (makespan):%s\n", w.mixed() ? "s" : "",
                  w.name().c_str(), w.mixed() ? " (prefill:decode)" : "", chooser.c_str(),
                  tried.substr(0, tried.size() - 1).c_str());
    } else if (!o.json) {
      std::printf("tensor-parallel width %d, the smallest the model fits%s; --tp best simulates each\n", w.decode,
                  tried.empty() ? "" : (" (" + tried.substr(1, tried.size() - 2) + ")").c_str());
    }
  }
  for (int width : {w.prefill, w.decode})
    if (const std::string why = shape.width_problem(width); !why.empty()) throw Error("--tp " + o.tp + ": " + why);
  if (!o.json && shape.moe_layers > 0)
    std::printf("mixture of experts: %.0f experts, %.0f a token, in %.0f of %.0f layers; expert-parallel workers hold %.0f "
                "(prefill) and %.0f (decode) whole experts a GPU; a step reads about %.0f of a layer's experts for 1 "
                "token, %.0f for 16, %.0f for 256\n",
                shape.experts, shape.top_k, shape.moe_layers, shape.layers, shape.experts / w.prefill,
                shape.experts / w.decode, shape.experts_touched(1), shape.experts_touched(16), shape.experts_touched(256));
  const std::vector<std::string> policies = o.policy == "all" ? planner::all_policies(o.gpus, w) : std::vector{o.policy};
  if (!o.plot.empty() && policies.size() > 1) throw Error("--plot draws one policy's run; give --policy NAME, not all");
  // One cluster for every re-splitting policy; a fixed split of two widths places its own workers.
  std::unique_ptr<Cluster> shared;
  nlohmann::json all = nlohmann::json::array();
  for (const auto& name : policies) {
    const std::string in_units = planner::policy_in_units(name, w);
    std::unique_ptr<Cluster> own;
    if (w.mixed() && planner::is_static(name)) own = std::make_unique<Cluster>(planner::cluster_for(name, shape, hw, w));
    else if (!shared) shared = std::make_unique<Cluster>(planner::cluster_for(name, shape, hw, w));
    const Cluster& c = own ? *own : *shared;
    so.workers = c.units();
    planner::Simulator sim(so, c.cells);
    auto policy = planner::make_policy(in_units, so.workers);
    const auto r = sim.run(requests, *policy);
    all.push_back(result_json(name, r, c));
    all.back()["tp"] = {{"prefill", w.prefill}, {"decode", w.decode}};
    if (!o.plot.empty())
      plot(o.plot, name + " on " + std::to_string(o.gpus) + " x " + o.hardware + ": workers by role and output tokens/s", r);
    if (o.json) continue;
    if (policies.size() > 1) {
      std::printf("%-14s makespan %10.2f s  %10.0f tok/s  TTFT p50/p99 %8.0f/%8.0f ms  ITL p50/p99 %6.1f/%6.1f ms  good %5.1f%%\n",
                  name.c_str(), r.makespan_s, r.output_tokens_per_s(), r.ttft_p50_s * 1e3, r.ttft_p99_s * 1e3,
                  r.itl_p50_s * 1e3, r.itl_p99_s * 1e3, 100.0 * static_cast<double>(r.good_requests) / static_cast<double>(r.requests));
      continue;
    }
    print_result(o, name, c, r);
  }
  if (o.json) std::cout << (all.size() == 1 ? all[0] : all).dump(2) << "\n";
  return 0;
}

}  // namespace

Action add_simulate_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("simulate", "Simulate a job on a cluster of GPUs (discrete events, virtual time)");
  auto o = std::make_shared<SimulateOptions>();
  cmd->add_option("--workload", o->workload, "Workload TOML: [[phase]] tables (requests, isl, osl, arrival)");
  cmd->add_option("--trace", o->trace, "Replay a finished job: its tandem run output JSONL (prompt and output lengths)");
  cmd->add_option("--model-config", o->model_config, "The model's Hugging Face config.json (or its directory)")->required();
  cmd->add_option("--hardware", o->hardware, "h100, h200, b200, a profile TOML, or kinds with counts: b200:2,h100:6");
  cmd->add_option("--gpus", o->gpus, "GPUs (in workers of --tp each)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--tp", o->tp, "Tensor-parallel width of a worker: 1, 2, 4, 8; P:D (prefill and decode widths: a "
                                 "re-split moves lcm(P, D) GPUs); or best (simulate each width and pair, keep the "
                                 "fastest); default: the smallest the model fits");
  cmd->add_option("--policy", o->policy, "static:P:D (GPUs per phase), agg, sla, lookahead, oracle, or all (a comparison table)");
  cmd->add_option("--epoch-requests", o->sim.epoch_requests, "Requests per planning epoch")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--max-num-seqs", o->sim.max_num_seqs, "Sequences per worker at once")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-batched-tokens", o->sim.max_batched_tokens, "Tokens per engine step")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--local-prefill-tokens", o->sim.local_prefill_tokens, "Shorter prompts prefill on their decode worker");
  cmd->add_option("--ttft-ms", o->ttft_ms, "TTFT target for goodput and the sla policy");
  cmd->add_option("--itl-ms", o->itl_ms, "ITL target for goodput and the sla policy");
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->add_option("--plot", o->plot, "Draw the split and the throughput over time into this PNG (needs gnuplot)");
  return [o]() { return simulate(*o); };
}

}  // namespace tandem::launcher
