#include "runtime/model/model_config.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tandem::runtime {
namespace {

int64_t positive(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0) {
    throw Error(where + ": '" + key + "' must be a positive integer" + (j.contains(key) ? "" : " (missing)"));
  }
  return j[key].get<int64_t>();
}

// The routing fields of mixtures of experts this engine does not implement:
// a checkpoint that sets one to anything but its plain value stops here,
// naming it, rather than running a different model than it describes.
void refuse_routing(const nlohmann::json& j, const std::string& where) {
  struct Field {
    const char* key;
    nlohmann::json plain;  // the value that means what this engine does
    const char* what;
  };
  const Field fields[] = {
      {"shared_expert_intermediate_size", 0, "shared experts"},
      {"n_shared_experts", 0, "shared experts"},
      {"scoring_func", "softmax", "a router scored other than by softmax"},
      {"topk_method", "greedy", "grouped top-k routing"},
      {"n_group", 1, "grouped top-k routing"},
      {"topk_group", 1, "grouped top-k routing"},
      {"routed_scaling_factor", 1.0, "scaled routing weights"},
  };
  for (const Field& f : fields) {
    if (!j.contains(f.key) || j[f.key].is_null()) continue;
    const auto& v = j[f.key];
    const bool plain = v.is_number() && f.plain.is_number() ? v.get<double>() == f.plain.get<double>() : v == f.plain;
    if (!plain)
      throw Error(where + ": " + f.key + " = " + v.dump() + ": " + f.what +
                  " (DeepSeek's routing) is not supported; Tandem runs Qwen3-MoE's and Mixtral's");
  }
}

// Qwen3-MoE: layer L is MoE when L is not in mlp_only_layers and (L + 1) %
// decoder_sparse_step == 0, else a dense MLP of intermediate_size. Mixtral:
// every layer, experts of intermediate_size, the top k always renormalised.
void parse_moe(const nlohmann::json& j, const std::string& where, ModelConfig& c) {
  const std::string& a = c.architecture;
  if (a != "Qwen3MoeForCausalLM" && a != "MixtralForCausalLM") return;
  refuse_routing(j, where);
  MoeConfig& m = c.moe;
  const bool qwen = a == "Qwen3MoeForCausalLM";
  m.experts = positive(j, qwen ? "num_experts" : "num_local_experts", where);
  m.top_k = positive(j, "num_experts_per_tok", where);
  if (m.top_k > m.experts)
    throw Error(where + ": num_experts_per_tok (" + std::to_string(m.top_k) + ") is more than the " +
                std::to_string(m.experts) + " experts");
  m.intermediate = qwen ? positive(j, "moe_intermediate_size", where) : c.intermediate;
  m.norm_topk = qwen ? j.value("norm_topk_prob", false) : true;
  m.sparse.assign(static_cast<std::size_t>(c.layers), true);
  if (!qwen) return;
  const int64_t step = j.contains("decoder_sparse_step") ? positive(j, "decoder_sparse_step", where) : 1;
  for (int64_t l = 0; l < c.layers; ++l) m.sparse[static_cast<std::size_t>(l)] = (l + 1) % step == 0;
  if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array())
    for (const auto& x : j["mlp_only_layers"]) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c.layers)
        throw Error(where + ": mlp_only_layers holds " + x.dump() + ", not a layer of the " + std::to_string(c.layers));
      m.sparse[static_cast<std::size_t>(x.get<int64_t>())] = false;
    }
}

}  // namespace

ModelConfig ModelConfig::load(const std::filesystem::path& model_dir) {
  if (std::filesystem::exists(model_dir) && !std::filesystem::is_directory(model_dir))
    throw Error(model_dir.string() + ": is a file, not a model directory; give the directory that holds config.json, "
                                     "the *.safetensors and tokenizer.json (model.path or --model)");
  const auto path = model_dir / "config.json";
  std::ifstream in(path);
  if (!in) {
    throw Error(path.string() + ": cannot read the model config" +
                (std::filesystem::exists(model_dir) ? " (missing from the model directory)" : " (no such directory)"));
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path.string() + ": not valid JSON at byte " + std::to_string(e.byte));
  }
  return parse(j, path.string());
}

ModelConfig ModelConfig::parse(const nlohmann::json& j, const std::string& where) {
  ModelConfig c;
  if (!j.is_object()) throw Error(where + ": expected a JSON object");
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty())
    c.architecture = j["architectures"][0].get<std::string>();
  const std::string& a = c.architecture;
  const bool qwen3 = a == "Qwen3ForCausalLM" || a == "Qwen3MoeForCausalLM";
  const bool mistral = a == "MistralForCausalLM" || a == "MixtralForCausalLM";
  if (a != "LlamaForCausalLM" && !mistral && a != "Qwen2ForCausalLM" && !qwen3) {
    throw Error(where + ": architecture '" + a +
                "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                "Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM)");
  }
  c.hidden = positive(j, "hidden_size", where);
  c.intermediate = positive(j, "intermediate_size", where);
  c.layers = positive(j, "num_hidden_layers", where);
  parse_moe(j, where, c);
  c.heads = positive(j, "num_attention_heads", where);
  c.kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                   ? positive(j, "num_key_value_heads", where)
                   : c.heads;
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? positive(j, "head_dim", where) : c.hidden / c.heads;
  c.vocab = positive(j, "vocab_size", where);
  c.max_position_embeddings =
      j.contains("max_position_embeddings") ? positive(j, "max_position_embeddings", where) : 4096;
  if (c.heads % c.kv_heads != 0) {
    throw Error(where + ": num_attention_heads (" + std::to_string(c.heads) +
                ") must be a multiple of num_key_value_heads (" + std::to_string(c.kv_heads) + ")");
  }
  if (c.head_dim % 2 != 0) throw Error(where + ": head_dim must be even for rotary embeddings");
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
  c.rope_theta = j.value("rope_theta", 10000.0);
  c.tie_embeddings = j.value("tie_word_embeddings", false);
  c.qkv_bias = a == "Qwen2ForCausalLM" || j.value("attention_bias", false);
  c.o_bias = a != "Qwen2ForCausalLM" && j.value("attention_bias", false);
  if (j.value("mlp_bias", false)) throw Error(where + ": mlp_bias: true is not supported");
  if (j.contains("hidden_act") && j["hidden_act"].is_string() && j["hidden_act"] != "silu" && j["hidden_act"] != "swish")
    throw Error(where + ": hidden_act '" + j["hidden_act"].get<std::string>() + "' is not supported (supported: silu)");
  if (j.contains("sliding_window") && j["sliding_window"].is_number_integer()) {
    if (mistral) {
      c.sliding_window = j["sliding_window"].get<int64_t>();
    } else if (j.value("use_sliding_window", false)) {
      throw Error(where + ": use_sliding_window: true is not supported for " + a);
    }
  }
  c.qk_norm = qwen3;
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) {
    const std::string d = j["torch_dtype"];
    if (!parse_dtype(d, c.dtype) || dtype_size(c.dtype) == 1)
      throw Error(where + ": torch_dtype '" + d + "' is not supported (supported: float32, bfloat16, float16)");
  }
  c.quant = parse_quantization(j, where);
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const auto& r = j["rope_scaling"];
    const std::string type = r.value("rope_type", r.value("type", ""));
    if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
    } else if (type == "llama3") {
      c.rope_scaling.type = RopeScaling::Type::kLlama3;
      c.rope_scaling.low_freq_factor = r.value("low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = r.value("high_freq_factor", 4.0);
      c.rope_scaling.original_max_position_embeddings = r.value("original_max_position_embeddings", int64_t{8192});
    } else if (type != "default" && !type.empty()) {
      throw Error(where + ": rope_scaling type '" + type + "' is not supported (supported: linear, llama3)");
    }
    c.rope_scaling.factor = r.value("factor", 1.0);
  }
  auto ids = [&](const char* key) {
    std::vector<int32_t> out;
    if (!j.contains(key)) return out;
    if (j[key].is_number_integer()) out.push_back(j[key].get<int32_t>());
    else if (j[key].is_array())
      for (const auto& x : j[key]) out.push_back(x.get<int32_t>());
    return out;
  };
  c.eos_token_ids = ids("eos_token_id");
  if (auto b = ids("bos_token_id"); !b.empty()) c.bos_token_id = b[0];
  return c;
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j = {
      {"architectures", {architecture}},
      {"model_type", architecture == "Qwen3ForCausalLM"      ? "qwen3"
                     : architecture == "Qwen3MoeForCausalLM" ? "qwen3_moe"
                     : architecture == "MixtralForCausalLM"  ? "mixtral"
                     : architecture == "Qwen2ForCausalLM"    ? "qwen2"
                                                             : "llama"},
      {"hidden_size", hidden},
      {"intermediate_size", intermediate},
      {"num_hidden_layers", layers},
      {"num_attention_heads", heads},
      {"num_key_value_heads", kv_heads},
      {"head_dim", head_dim},
      {"vocab_size", vocab},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"tie_word_embeddings", tie_embeddings},
      {"hidden_act", "silu"},
      {"torch_dtype", dtype == DType::kF32 ? "float32" : dtype == DType::kBF16 ? "bfloat16" : "float16"},
  };
  if (architecture == "LlamaForCausalLM" || architecture == "MistralForCausalLM") j["attention_bias"] = qkv_bias;
  if (sliding_window > 0) j["sliding_window"] = sliding_window;
  if (architecture == "Qwen3MoeForCausalLM") {
    j["num_experts"] = moe.experts;
    j["num_experts_per_tok"] = moe.top_k;
    j["moe_intermediate_size"] = moe.intermediate;
    j["norm_topk_prob"] = moe.norm_topk;
    j["decoder_sparse_step"] = 1;
    nlohmann::json dense = nlohmann::json::array();
    for (int64_t l = 0; l < layers; ++l)
      if (!moe.sparse[static_cast<std::size_t>(l)]) dense.push_back(l);
    j["mlp_only_layers"] = dense;
  } else if (architecture == "MixtralForCausalLM") {
    j["num_local_experts"] = moe.experts;
    j["num_experts_per_tok"] = moe.top_k;
  }
  if (rope_scaling.type == RopeScaling::Type::kLinear) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
  } else if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling.factor},
                         {"low_freq_factor", rope_scaling.low_freq_factor},
                         {"high_freq_factor", rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  }
  if (!eos_token_ids.empty()) j["eos_token_id"] = eos_token_ids.size() == 1 ? nlohmann::json(eos_token_ids[0]) : nlohmann::json(eos_token_ids);
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  return j;
}

}  // namespace tandem::runtime
