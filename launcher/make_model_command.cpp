// `tandem make-model`: a deterministic random-weight checkpoint in Hugging
// Face format, for tests, benchmarks and the demo.
#include <iostream>
#include <memory>
#include <vector>

#include "launcher/commands.h"
#include "runtime/model/make_model.h"

namespace tandem::launcher {

Action add_make_model_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("make-model", "Write a random-weight Hugging Face checkpoint (tests, benchmarks, demo)");
  auto o = std::make_shared<runtime::MakeModelOptions>();
  auto tokenizer = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto tie = std::make_shared<bool>(false);
  auto untie = std::make_shared<bool>(false);
  cmd->add_option("--arch", o->arch,
                  "llama, qwen2 (q/k/v bias), qwen3 (q/k norm), or the mixtures of experts qwen3_moe and mixtral")
      ->check(CLI::IsMember({"llama", "qwen2", "qwen3", "qwen3_moe", "mixtral"}));
  cmd->add_option("--preset", o->preset, "tiny, small, or bench (the shape of Qwen3-0.6B)")
      ->check(CLI::IsMember({"tiny", "small", "bench"}));
  cmd->add_option("--tokenizer", *tokenizer, "Directory with tokenizer.json to copy; sets the vocabulary")->required();
  cmd->add_option("--seed", o->seed, "Random seed (same seed and options: same bytes)");
  cmd->add_option("--out", *out, "Output directory")->required();
  cmd->add_option("--hidden", o->hidden, "hidden_size");
  cmd->add_option("--layers", o->layers, "num_hidden_layers");
  cmd->add_option("--heads", o->heads, "num_attention_heads");
  cmd->add_option("--kv-heads", o->kv_heads, "num_key_value_heads");
  cmd->add_option("--head-dim", o->head_dim, "head_dim");
  cmd->add_option("--intermediate", o->intermediate, "intermediate_size");
  cmd->add_option("--max-position", o->max_position, "max_position_embeddings");
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or f16")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_flag("--tie-embeddings", *tie, "Share the embedding with the LM head");
  cmd->add_flag("--untie-embeddings", *untie, "Give the model its own LM head");
  cmd->add_option("--rope-scaling", o->rope_scaling, "linear:FACTOR or llama3:FACTOR");
  cmd->add_option("--shards", o->shards, "Write this many safetensors shards and an index")->check(CLI::Range(1, 64));
  cmd->add_option("--experts", o->experts, "MoE: experts per MoE layer (num_experts, num_local_experts)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  cmd->add_option("--experts-per-token", o->experts_per_token, "MoE: experts each token is routed to (num_experts_per_tok)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  cmd->add_option("--moe-intermediate", o->moe_intermediate, "MoE: an expert's width (moe_intermediate_size)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  auto dense = std::make_shared<std::vector<int64_t>>();
  CLI::Option* dense_option =
      cmd->add_option("--dense-layers", *dense, "qwen3_moe: layers with a dense MLP (mlp_only_layers: 0,3); default 0")
          ->delimiter(',');
  return [o, tokenizer, out, tie, untie, dense, dense_option]() {
    if (dense_option->count() > 0) o->dense_layers = *dense;
    o->tokenizer_dir = *tokenizer;
    o->out_dir = *out;
    if (*tie) o->tie_embeddings = true;
    if (*untie) o->tie_embeddings = false;
    const auto c = runtime::make_model(*o);
    std::cout << "wrote " << *out << ": " << c.architecture << ", hidden " << c.hidden << ", layers " << c.layers
              << ", heads " << c.heads << "/" << c.kv_heads << ", head_dim " << c.head_dim << ", vocab " << c.vocab
              << ", " << runtime::dtype_name(c.dtype)
              << (c.moe.any() ? ", " + std::to_string(c.moe.experts) + " experts (top " + std::to_string(c.moe.top_k) + ")"
                              : std::string())
              << "\n";
    return 0;
  };
}

}  // namespace tandem::launcher
