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
  if (a != "LlamaForCausalLM" && a != "MistralForCausalLM" && a != "Qwen2ForCausalLM" && a != "Qwen3ForCausalLM") {
    throw Error(where + ": architecture '" + a +
                "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                "Qwen3ForCausalLM)");
  }
  c.hidden = positive(j, "hidden_size", where);
  c.intermediate = positive(j, "intermediate_size", where);
  c.layers = positive(j, "num_hidden_layers", where);
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
    if (a == "MistralForCausalLM") {
      c.sliding_window = j["sliding_window"].get<int64_t>();
    } else if (j.value("use_sliding_window", false)) {
      throw Error(where + ": use_sliding_window: true is not supported for " + a);
    }
  }
  c.qk_norm = a == "Qwen3ForCausalLM";
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) {
    const std::string d = j["torch_dtype"];
    if (!parse_dtype(d, c.dtype))
      throw Error(where + ": torch_dtype '" + d + "' is not supported (supported: float32, bfloat16, float16)");
  }
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
      {"model_type", architecture == "Qwen3ForCausalLM"   ? "qwen3"
                     : architecture == "Qwen2ForCausalLM" ? "qwen2"
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
