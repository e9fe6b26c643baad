// `tandem generate`: one prompt, one process, no MPI: the CPU engine as a
// user (or a test) meets it directly.
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "launcher/commands.h"
#include "launcher/run/job_checks.h"
#include "router/batch_request.h"
#include "runtime/service/worker_core.h"
#include "runtime/cpu/kernels.h"
#include "runtime/engine/engine.h"
#include "runtime/model/weights.h"

namespace tandem::launcher {
namespace {

struct GenerateOptions {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  bool json = false;
  int threads = 0;
  std::string kv_dtype = "auto";
  std::string cpu_matmul = "f32";
  runtime::SamplingParams params;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      std::size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      throw Error("--prompt-ids: '" + item + "' is not an integer; write ids as 1,2,3");
    }
  }
  return ids;
}

nlohmann::json logprobs_json(const runtime::PositionLogprobs& p) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& t : p.top) top.push_back({{"token_id", t.token}, {"logprob", t.logprob}});
  return {{"token_id", p.chosen.token}, {"logprob", p.chosen.logprob}, {"top", top}};
}

int run_generate(const GenerateOptions& o) {
  const auto config = runtime::ModelConfig::load(o.model);
  std::unique_ptr<runtime::Tokenizer> tok;
  if (std::filesystem::exists(std::filesystem::path(o.model) / "tokenizer.json")) tok = runtime::Tokenizer::load(o.model);
  std::vector<int32_t> prompt;
  if (!o.prompt_ids.empty()) {
    prompt = parse_ids(o.prompt_ids);
  } else {
    if (!tok) throw Error(o.model + ": no tokenizer.json; give --prompt-ids instead of --prompt");
    prompt = tok->encode(o.prompt, true);
  }
  use_cpu_matmul(o.cpu_matmul, config, o.model, "");  // before any weight is read: a refusal costs nothing
  const auto weights = runtime::ModelWeights::load(config, o.model);
  const int64_t block = 16;
  const int64_t tokens = std::min<int64_t>(static_cast<int64_t>(prompt.size()) + std::max<int64_t>(1, o.params.max_tokens),
                                           config.max_position_embeddings);
  kv::KvLayout layout{config.layers, config.kv_heads, config.head_dim, block};
  layout.elem_bytes = kv_elem_bytes(o.kv_dtype, true, o.cpu_matmul, config);
  kv::BlockPool pool(layout, (tokens + block - 1) / block);
  runtime::cpu::ThreadPool threads(o.threads);
  runtime::Engine engine(config, *weights, pool, threads, tok.get(), runtime::EngineOptions{1, 2048, 0});
  runtime::EngineRequest req;
  req.id = 0;
  req.prompt = prompt;
  req.params = o.params;
  req.rng_key = router::sampling_key(true, o.params.seed, 0, "");  // as run and serve key a request's "seed"
  engine.add(std::move(req));
  runtime::EngineOutput result;
  while (engine.has_work()) {
    for (auto& out : engine.step())
      if (out.finished) result = std::move(out);
  }
  if (o.json) {
    nlohmann::json j = {{"prompt_token_ids", prompt},
                        {"token_ids", result.tokens},
                        {"text", result.text},
                        {"finish_reason", runtime::finish_reason_name(result.reason)},
                        {"ttft_s", result.ttft_s},
                        {"e2e_s", result.e2e_s},
                        {"kernels", runtime::cpu::kernels().name},
                        {"kv_dtype", pool.layout().dtype_name()}};
    if (o.params.logprobs >= 0) {
      j["logprobs"] = nlohmann::json::array();
      for (const auto& p : result.logprobs) j["logprobs"].push_back(logprobs_json(p));
    }
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << result.text << "\n";
  }
  return 0;
}

}  // namespace

Action add_generate_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("generate", "Generate from one prompt in this process on the CPU engine");
  auto o = std::make_shared<GenerateOptions>();
  cmd->add_option("--model", o->model, "Hugging Face model directory")->required();
  auto* text = cmd->add_option("--prompt", o->prompt, "Prompt text (tokenized with the model's tokenizer)");
  auto* ids = cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as token ids: 1,2,3");
  text->excludes(ids);
  cmd->add_option("--max-tokens", o->params.max_tokens, "Tokens to generate at most")->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o->params.temperature, "0: greedy")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", o->params.top_k, "Keep the k most likely tokens; 0: off");
  cmd->add_option("--top-p", o->params.top_p, "Nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", o->params.min_p, "Drop tokens below min-p times the best")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", o->params.seed, "Sampling seed");
  cmd->add_option("--logprobs", o->params.logprobs, "With --json: log-probabilities of each token and the top N");
  cmd->add_flag("--ignore-eos", o->params.ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_option("--threads", o->threads, "Compute threads; 0: every CPU this process may use");
  cmd->add_option("--kv-dtype", o->kv_dtype,
                  "KV cache elements, as kv.dtype: f32, bf16, fp8 or auto (bf16 under --cpu-matmul bf16-amx, else f32)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}));
  cmd->add_option("--cpu-matmul", o->cpu_matmul,
                  "The products' arithmetic, as model.cpu_matmul: f32, bf16, bf16-amx or int8 (docs/engine.md)")
      ->check(CLI::IsMember({"f32", "bf16", "bf16-amx", "int8"}));
  cmd->add_flag("--json", o->json, "Print JSON with token_ids, text, finish_reason, timings and the kernels that ran");
  return [o, text, ids]() {
    if (text->count() == 0 && ids->count() == 0) throw Error("generate: give --prompt TEXT or --prompt-ids 1,2,3");
    return run_generate(*o);
  };
}

}  // namespace tandem::launcher
