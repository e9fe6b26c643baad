// `tandem plan -c job.toml`: the planner's dry run. Reads the job's input,
// builds every prompt as `tandem run` would (so prompt lengths are exact),
// and prints the split the policy would choose for each epoch with its
// predicted duration — without starting a worker.
#include <cstdio>
#include <fstream>
#include <memory>

#include "common/error.h"
#include "launcher/commands.h"
#include "router/body_defaults.h"
#include "planner/epoch_planner.h"
#include "router/prompt_builder.h"
#include "runtime/tokenizer/chat_template.h"

namespace tandem::launcher {
namespace {

struct PlanOptions {
  ConfigOptions config;
  std::string input, hardware = "h100", policy;
  int64_t workers = 0;
};

int plan(const PlanOptions& o) {
  Config cfg = o.config.load();
  if (!o.input.empty()) cfg.job.input = o.input;
  if (cfg.model.path.empty()) throw Error("no model: set model.path in the job file");
  if (cfg.job.input.empty()) throw Error("no input: set job.input in the job file or pass --input FILE");
  if (o.workers < 2) throw Error("--workers: the worker ranks of the job (ranks - 1), at least 2 to split");
  const auto model = runtime::ModelConfig::load(cfg.model.path);
  const auto tokenizer = runtime::Tokenizer::load(cfg.model.path);
  std::unique_ptr<router::BodyDefaults> defaults;  // [defaults]: the lines as the job would read them
  if (!cfg.defaults.empty()) defaults = std::make_unique<router::BodyDefaults>(router::BodyDefaults::parse(cfg.defaults, cfg.defaults_source));
  router::PromptContext prompts;
  prompts.tokenizer = tokenizer.get();
  std::unique_ptr<runtime::ChatTemplate> chat;
  try {
    chat = std::make_unique<runtime::ChatTemplate>(runtime::ChatTemplate::select(
        cfg.model.chat_template, tokenizer->config(), cfg.model.path + "/tokenizer_config.json"));
  } catch (const Error& e) {
    prompts.chat_error = e.what();
  }
  prompts.chat = chat.get();
  prompts.max_model_len = cfg.model.max_model_len > 0 ? std::min(cfg.model.max_model_len, model.max_position_embeddings)
                                                      : model.max_position_embeddings;
  prompts.vocab_size = static_cast<int32_t>(model.vocab);

  // The requests as the planner sees them: prompt length and max_tokens (the
  // most a request can generate; stop strings and EOS may end it sooner).
  std::ifstream in(cfg.job.input);
  if (!in) throw Error(cfg.job.input + ": cannot read the input");
  std::vector<planner::Request> reqs;
  int64_t bad = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto parsed = router::parse_batch_line(line, 16, defaults.get());
    if (std::holds_alternative<router::LineError>(parsed)) {
      ++bad;
      continue;
    }
    auto& r = std::get<router::BatchRequest>(parsed);
    auto ids = router::build_prompt(r, prompts);
    if (std::holds_alternative<router::LineError>(ids)) {
      ++bad;
      continue;
    }
    reqs.push_back({.isl = static_cast<int64_t>(std::get<std::vector<int32_t>>(ids).size()),
                    .osl = r.endpoint == router::Endpoint::kEmbeddings ? 1 : r.params.max_tokens});  // a prefill alone
  }
  if (reqs.empty()) throw Error(cfg.job.input + ": no valid requests to plan");

  // Workers of cluster.tp ranks (GPUs) each, as the job would run them.
  const int tp = cfg.cluster.decode_width();
  if (cfg.cluster.prefill_width() != tp)
    throw Error("cluster.prefill_tp and cluster.decode_tp differ: a job re-splits workers of one width only; set cluster.tp "
                "(tandem simulate --tp P:D plans re-splits between two widths)");
  if (o.workers % tp != 0)
    throw Error("--workers " + std::to_string(o.workers) + " is not whole workers of cluster.tp = " + std::to_string(tp));
  auto shape = planner::ModelShape::from(model).at_width(tp);
  shape.expert_parallel = cfg.cluster.expert_parallel;
  if (const std::string why = shape.width_problem(tp); !why.empty()) throw Error("cluster.tp = " + std::to_string(tp) + ": " + why);
  const planner::PerfModel pm(shape, planner::HardwareProfile::named(o.hardware));
  planner::SimOptions so;
  so.workers = o.workers / tp;
  so.max_num_seqs = cfg.job.max_num_seqs;
  so.max_batched_tokens = cfg.job.max_batched_tokens;
  so.epoch_requests = cfg.job.epoch_requests;
  so.local_prefill_tokens = cfg.router.local_prefill_tokens;
  so.ttft_target_s = cfg.planner.ttft_ms / 1e3;
  so.itl_target_s = cfg.planner.itl_ms / 1e3;
  const std::string policy_name = o.policy.empty() ? cfg.planner.policy : o.policy;
  planner::EpochPlanner planner(so, shape, pm.hardware(), policy_name);
  std::printf("%zu requests (%lld bad lines left out), %lld workers%s (%s), policy %s, epochs of %lld requests\n",
              reqs.size(), static_cast<long long>(bad), static_cast<long long>(so.workers),
              tp > 1 ? (" of tp " + std::to_string(tp)).c_str() : "", o.hardware.c_str(), policy_name.c_str(),
              static_cast<long long>(so.epoch_requests));
  double total = 0;
  for (std::size_t lo = 0; lo < reqs.size(); lo += static_cast<std::size_t>(so.epoch_requests)) {
    const std::size_t hi = std::min(reqs.size(), lo + static_cast<std::size_t>(so.epoch_requests));
    const auto d = planner.decide(std::span<const planner::Request>(reqs.data() + lo, hi - lo));
    std::printf("%s\n", d.describe().c_str());
    total += d.predicted_s;
  }
  std::printf("predicted makespan %.2f s (epochs one after another; outputs assumed to reach max_tokens)\n", total);
  return 0;
}

}  // namespace

Action add_plan_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("plan", "Dry run of the planner: the split and predicted time of each epoch of a job");
  auto o = std::make_shared<PlanOptions>();
  o->config.add_to(cmd);
  cmd->add_option("--input", o->input, "Input JSONL (overrides job.input)");
  cmd->add_option("--workers", o->workers, "Worker ranks of the job (ranks - 1)")->required();
  cmd->add_option("--hardware", o->hardware, "h100, h200, b200 or a profile TOML (see docs/planner.md)");
  cmd->add_option("--policy", o->policy, "Override planner.policy: static:P:D, agg, sla or lookahead");
  return [o]() { return plan(*o); };
}

}  // namespace tandem::launcher
