#include "runtime/model/make_model.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/model/safetensors.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem::runtime {
namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// A tensor of uniform values in [center - spread, center + spread), drawn from
// a stream keyed by (seed, name) so each tensor is independent of the others.
TensorData random_tensor(const std::string& name, std::vector<int64_t> shape, DType dtype, uint64_t seed,
                         float center, float spread) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  TensorData t{name, dtype, std::move(shape), {}};
  t.bytes.resize(static_cast<std::size_t>(n) * dtype_size(dtype));
  uint64_t state = seed ^ fnv1a(name);
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
    const float v = center + spread * static_cast<float>(2.0 * u - 1.0);
    uint8_t* p = t.bytes.data() + static_cast<std::size_t>(i) * dtype_size(dtype);
    if (dtype == DType::kF32) {
      std::memcpy(p, &v, 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(p, &h, 2);
    }
  }
  return t;
}

}  // namespace

ModelConfig make_model_config(const MakeModelOptions& o, int64_t tokenizer_vocab) {
  ModelConfig c;
  if (o.arch == "llama") c.architecture = "LlamaForCausalLM";
  else if (o.arch == "qwen2") c.architecture = "Qwen2ForCausalLM";
  else if (o.arch == "qwen3") c.architecture = "Qwen3ForCausalLM";
  else if (o.arch == "qwen3_moe") c.architecture = "Qwen3MoeForCausalLM";
  else if (o.arch == "mixtral") c.architecture = "MixtralForCausalLM";
  else throw Error("--arch must be llama, qwen2, qwen3, qwen3_moe or mixtral, got '" + o.arch + "'");
  const bool moe = o.arch == "qwen3_moe" || o.arch == "mixtral";
  if (o.preset == "tiny") {
    c.hidden = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.head_dim = 16, c.intermediate = 128;
    c.max_position_embeddings = 4096;
  } else if (o.preset == "small") {
    c.hidden = 256, c.layers = 4, c.heads = 8, c.kv_heads = 4, c.head_dim = 32, c.intermediate = 768;
    c.max_position_embeddings = 8192;
  } else if (o.preset == "bench") {  // Qwen3-0.6B
    c.hidden = 1024, c.layers = 28, c.heads = 16, c.kv_heads = 8, c.head_dim = 128, c.intermediate = 3072;
    c.max_position_embeddings = 40960;
  } else {
    throw Error("--preset must be tiny, small or bench, got '" + o.preset + "'");
  }
  c.tie_embeddings = o.preset == "bench";
  c.rope_theta = o.preset == "bench" ? 1000000.0 : 10000.0;
  c.rms_norm_eps = 1e-6;
  c.hidden = o.hidden.value_or(c.hidden);
  c.layers = o.layers.value_or(c.layers);
  c.heads = o.heads.value_or(c.heads);
  c.kv_heads = o.kv_heads.value_or(c.kv_heads);
  c.head_dim = o.head_dim.value_or(o.hidden && !o.head_dim ? c.hidden / c.heads : c.head_dim);
  c.intermediate = o.intermediate.value_or(c.intermediate);
  c.max_position_embeddings = o.max_position.value_or(c.max_position_embeddings);
  c.tie_embeddings = o.tie_embeddings.value_or(c.tie_embeddings);
  c.qkv_bias = o.arch == "qwen2";
  c.qk_norm = o.arch == "qwen3" || o.arch == "qwen3_moe";
  if (moe) {  // the presets' experts: 8 (tiny), 16 (small), 64 (bench) of a quarter of the dense width, 2 a token
    const int64_t preset_experts = o.preset == "tiny" ? 8 : o.preset == "small" ? 16 : 64;
    c.moe.experts = o.experts.value_or(preset_experts);
    c.moe.top_k = o.experts_per_token.value_or(2);
    c.moe.intermediate = o.moe_intermediate.value_or(c.intermediate / 4);
    c.moe.norm_topk = true;
    c.moe.sparse.assign(static_cast<std::size_t>(c.layers), true);
    if (o.arch == "mixtral") {
      if (o.dense_layers) throw Error("--dense-layers is Qwen3-MoE's (mlp_only_layers); every Mixtral layer is MoE");
      c.intermediate = c.moe.intermediate;  // Mixtral's intermediate_size is its experts'
    } else {
      for (int64_t l : o.dense_layers.value_or(c.layers > 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{})) {
        if (l < 0 || l >= c.layers) throw Error("--dense-layers: " + std::to_string(l) + " is not a layer");
        c.moe.sparse[static_cast<std::size_t>(l)] = false;
      }
    }
  } else if (o.experts || o.experts_per_token || o.moe_intermediate || o.dense_layers) {
    throw Error("--experts, --experts-per-token, --moe-intermediate and --dense-layers are for --arch qwen3_moe or mixtral");
  }
  c.vocab = (tokenizer_vocab + 127) / 128 * 128;  // padded, as released checkpoints are
  if (!parse_dtype(o.dtype, c.dtype)) throw Error("--dtype must be f32, bf16 or f16, got '" + o.dtype + "'");
  if (!o.rope_scaling.empty()) {
    const auto colon = o.rope_scaling.find(':');
    const std::string type = o.rope_scaling.substr(0, colon);
    const double factor = colon == std::string::npos ? 0.0 : std::atof(o.rope_scaling.c_str() + colon + 1);
    if ((type != "linear" && type != "llama3") || factor <= 0)
      throw Error("--rope-scaling must be linear:FACTOR or llama3:FACTOR, got '" + o.rope_scaling + "'");
    c.rope_scaling.type = type == "linear" ? RopeScaling::Type::kLinear : RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = factor;
    if (type == "llama3") c.rope_scaling.original_max_position_embeddings = std::min<int64_t>(8192, c.max_position_embeddings / 4);
  }
  // Round-trip through the parser: every check it makes applies here too.
  return ModelConfig::parse(c.to_json(), "make-model");
}

ModelConfig make_model(const MakeModelOptions& o) {
  if (o.out_dir.empty()) throw Error("make-model: --out DIR is required");
  auto tok = Tokenizer::load(o.tokenizer_dir);
  ModelConfig c = make_model_config(o, tok->vocab_size());
  if (auto eos = tok->eos_id()) c.eos_token_ids = {*eos};
  if (auto bos = tok->bos_id()) c.bos_token_id = *bos;

  std::filesystem::create_directories(o.out_dir);
  const DType dt = c.dtype;
  const float in_h = 1.0f / std::sqrt(static_cast<float>(c.hidden));
  const float in_q = 1.0f / std::sqrt(static_cast<float>(c.heads * c.head_dim));
  const float in_i = 1.0f / std::sqrt(static_cast<float>(c.intermediate));
  const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
  // Uniform in [-s, s) has standard deviation s / sqrt(3): scale so each
  // projection keeps activations near unit size and logits spread out.
  const float k3 = std::sqrt(3.0f);

  std::vector<std::vector<TensorData>> shards(static_cast<std::size_t>(std::max<int64_t>(1, o.shards)));
  auto shard_of_layer = [&](int64_t layer) {
    return static_cast<std::size_t>(layer * static_cast<int64_t>(shards.size()) / c.layers);
  };
  shards.front().push_back(random_tensor("model.embed_tokens.weight", {c.vocab, c.hidden}, dt, o.seed, 0, k3));
  for (int64_t l = 0; l < c.layers; ++l) {
    auto& out = shards[shard_of_layer(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back(random_tensor(p + "input_layernorm.weight", {c.hidden}, dt, o.seed, 1.0f, 0.1f));
    out.push_back(random_tensor(p + "self_attn.q_proj.weight", {q_dim, c.hidden}, dt, o.seed, 0, k3 * in_h));
    out.push_back(random_tensor(p + "self_attn.k_proj.weight", {kv_dim, c.hidden}, dt, o.seed, 0, k3 * in_h));
    out.push_back(random_tensor(p + "self_attn.v_proj.weight", {kv_dim, c.hidden}, dt, o.seed, 0, k3 * in_h));
    if (c.qkv_bias) {
      out.push_back(random_tensor(p + "self_attn.q_proj.bias", {q_dim}, dt, o.seed, 0, 0.1f));
      out.push_back(random_tensor(p + "self_attn.k_proj.bias", {kv_dim}, dt, o.seed, 0, 0.1f));
      out.push_back(random_tensor(p + "self_attn.v_proj.bias", {kv_dim}, dt, o.seed, 0, 0.1f));
    }
    if (c.qk_norm) {
      out.push_back(random_tensor(p + "self_attn.q_norm.weight", {c.head_dim}, dt, o.seed, 1.0f, 0.1f));
      out.push_back(random_tensor(p + "self_attn.k_norm.weight", {c.head_dim}, dt, o.seed, 1.0f, 0.1f));
    }
    out.push_back(random_tensor(p + "self_attn.o_proj.weight", {c.hidden, q_dim}, dt, o.seed, 0, k3 * in_q));
    out.push_back(random_tensor(p + "post_attention_layernorm.weight", {c.hidden}, dt, o.seed, 1.0f, 0.1f));
    if (c.moe.at(l)) {  // the router spread wide enough that tokens choose different experts
      const bool mixtral = c.architecture == "MixtralForCausalLM";
      const std::string m = p + (mixtral ? "block_sparse_moe." : "mlp.");
      const int64_t u = c.moe.intermediate;
      const float in_u = 1.0f / std::sqrt(static_cast<float>(u));
      out.push_back(random_tensor(m + "gate.weight", {c.moe.experts, c.hidden}, dt, o.seed, 0, 4 * k3 * in_h));
      for (int64_t e = 0; e < c.moe.experts; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        out.push_back(random_tensor(x + (mixtral ? "w1" : "gate_proj") + ".weight", {u, c.hidden}, dt, o.seed, 0, k3 * in_h));
        out.push_back(random_tensor(x + (mixtral ? "w3" : "up_proj") + ".weight", {u, c.hidden}, dt, o.seed, 0, k3 * in_h));
        out.push_back(random_tensor(x + (mixtral ? "w2" : "down_proj") + ".weight", {c.hidden, u}, dt, o.seed, 0, k3 * in_u));
      }
      continue;
    }
    out.push_back(random_tensor(p + "mlp.gate_proj.weight", {c.intermediate, c.hidden}, dt, o.seed, 0, k3 * in_h));
    out.push_back(random_tensor(p + "mlp.up_proj.weight", {c.intermediate, c.hidden}, dt, o.seed, 0, k3 * in_h));
    out.push_back(random_tensor(p + "mlp.down_proj.weight", {c.hidden, c.intermediate}, dt, o.seed, 0, k3 * in_i));
  }
  shards.back().push_back(random_tensor("model.norm.weight", {c.hidden}, dt, o.seed, 1.0f, 0.1f));
  if (!c.tie_embeddings)
    shards.back().push_back(random_tensor("lm_head.weight", {c.vocab, c.hidden}, dt, o.seed, 0, k3 * in_h));

  if (shards.size() == 1) {
    write_safetensors(o.out_dir / "model.safetensors", shards[0]);
  } else {
    nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    char name[64];
    for (std::size_t i = 0; i < shards.size(); ++i) {
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      write_safetensors(o.out_dir / name, shards[i]);
      for (const auto& t : shards[i]) index["weight_map"][t.name] = name;
    }
    std::ofstream(o.out_dir / "model.safetensors.index.json") << index.dump(2) << "\n";
  }
  std::ofstream(o.out_dir / "config.json") << c.to_json().dump(2) << "\n";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    if (std::filesystem::exists(o.tokenizer_dir / f))
      std::filesystem::copy_file(o.tokenizer_dir / f, o.out_dir / f, std::filesystem::copy_options::overwrite_existing);
  }
  return c;
}

}  // namespace tandem::runtime
