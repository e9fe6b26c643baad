#include "router/embeddings.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tandem::router {

using json = nlohmann::json;

namespace {

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot read it");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(path.string() + ": not valid JSON (" + e.what() + ")");
  }
}

bool one_of(const std::string& key, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), key) != names.end();
}

bool given(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

}  // namespace

// /v1/embeddings: input (a string, strings, token ids, lists of token ids),
// encoding_format, dimensions; model and the no-effect fields accepted; any
// other field refused.
void read_embedding_body(const json& body, BatchRequest& r, bool short_form, bool (*no_effect)(const std::string&)) {
  if (!body.is_object()) throw Error("'body' must be an object");
  for (const auto& [key, v] : body.items()) {
    if (one_of(key, {"input", "model", "encoding_format", "dimensions"}) || no_effect(key)) continue;
    if (short_form && one_of(key, {"custom_id", "method", "url"})) continue;
    if (v.is_null()) continue;
    throw Error("'" + key + "' is not an embeddings field (input, model, encoding_format, dimensions, user); remove it");
  }
  if (body.contains("model")) {
    if (!body["model"].is_string()) throw Error("'model' must be a string");
    r.model = body["model"].get<std::string>();
  }
  if (!given(body, "input")) throw Error("an embeddings request needs 'input': a string, strings, or token ids");
  const json& in = body["input"];
  auto ids_of = [](const json& a, const std::string& what) {
    std::vector<int32_t> ids;
    for (const auto& t : a) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        throw Error(what + " must hold token ids (integers from 0), got " + t.dump());
      ids.push_back(t.get<int32_t>());
    }
    if (ids.empty()) throw Error(what + " is empty");
    return ids;
  };
  if (in.is_string()) {
    if (in.get<std::string>().empty()) throw Error("'input' is an empty string");
    r.input_texts = std::vector<std::string>{in.get<std::string>()};
  } else if (in.is_array() && !in.empty() && in[0].is_string()) {
    r.input_texts.emplace();
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!in[i].is_string() || in[i].get<std::string>().empty())
        throw Error("'input[" + std::to_string(i) + "]' must be a non-empty string, as the inputs before it");
      r.input_texts->push_back(in[i].get<std::string>());
    }
  } else if (in.is_array() && !in.empty() && in[0].is_array()) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!in[i].is_array()) throw Error("'input[" + std::to_string(i) + "]' must be a list of token ids, as the first");
      r.input_ids.push_back(ids_of(in[i], "'input[" + std::to_string(i) + "]'"));
    }
  } else if (in.is_array() && !in.empty()) {
    r.input_ids.push_back(ids_of(in, "'input'"));
  } else {
    throw Error("'input' must be a non-empty string, a list of strings, a list of token ids or a list of such lists, got " +
              std::string(in.type_name()));
  }
  const std::size_t n = r.input_texts ? r.input_texts->size() : r.input_ids.size();
  if (n > kMaxEmbeddingInputs)
    throw Error("'input' has " + std::to_string(n) + " inputs; at most " + std::to_string(kMaxEmbeddingInputs) +
              " a request (split the line)");
  if (given(body, "encoding_format")) {
    const json& f = body["encoding_format"];
    if (f != "float" && f != "base64") throw Error("'encoding_format' must be \"float\" or \"base64\", got " + f.dump());
    r.base64 = f == "base64";
  }
  if (given(body, "dimensions")) {
    const json& v = body["dimensions"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      throw Error("'dimensions' must be an integer of at least 1, got " + v.dump());
    r.dimensions = v.get<int64_t>();
  }
}

EmbeddingPooling read_pooling(const std::string& model_dir) {
  EmbeddingPooling p;
  const std::filesystem::path dir(model_dir), modules_path = dir / "modules.json";
  if (!std::filesystem::exists(modules_path)) return p;
  const json modules = read_json(modules_path);
  if (!modules.is_array()) throw Error(modules_path.string() + ": must be a list of modules");
  p.normalize = false;
  bool pooled = false;
  for (const auto& m : modules) {
    const std::string type = m.value("type", "");
    const std::string name = type.substr(type.rfind('.') + 1);
    if (name == "Transformer") continue;  // the model itself
    if (name == "Normalize") {
      p.normalize = true;
      continue;
    }
    if (name != "Pooling")
      throw Error(modules_path.string() + ": module " + json(type).dump() +
                  " would change the embeddings and Tandem does not apply it; only Transformer, Pooling and Normalize are");
    const std::filesystem::path cfg_path = dir / m.value("path", "1_Pooling") / "config.json";
    const json cfg = read_json(cfg_path);
    std::vector<std::string> modes;
    for (const auto& [key, v] : cfg.items())
      if (key.rfind("pooling_mode_", 0) == 0 && v.is_boolean() && v.get<bool>()) modes.push_back(key);
    if (modes.size() != 1)
      throw Error(cfg_path.string() + ": " + std::to_string(modes.size()) +
                  " pooling modes are on; Tandem pools by exactly one (lasttoken, mean_tokens or cls_token)");
    if (modes[0] == "pooling_mode_lasttoken") p.pooling = runtime::Pooling::kLast;
    else if (modes[0] == "pooling_mode_mean_tokens") p.pooling = runtime::Pooling::kMean;
    else if (modes[0] == "pooling_mode_cls_token") p.pooling = runtime::Pooling::kCls;
    else throw Error(cfg_path.string() + ": " + modes[0] + " is not done by Tandem; it pools by lasttoken, mean_tokens or cls_token");
    if (cfg.contains("include_prompt") && cfg["include_prompt"] == false)
      throw Error(cfg_path.string() + ": include_prompt = false (pooling without an instruction prefix) is not done by "
                  "Tandem");
    pooled = true;
  }
  if (!pooled) throw Error(modules_path.string() + ": no Pooling module; Tandem needs one to know how to pool");
  const char* mode = p.pooling == runtime::Pooling::kLast ? "last token" : p.pooling == runtime::Pooling::kMean ? "mean" : "CLS";
  p.source = std::string("modules.json: ") + mode + (p.normalize ? ", normalised" : ", not normalised");
  return p;
}

EmbeddingPooling pooling_or_error(const std::string& model_dir) {
  try {
    return read_pooling(model_dir);
  } catch (const Error& e) {
    EmbeddingPooling p;
    p.error = e.what();
    return p;
  }
}

std::vector<float> finish_embedding(std::span<const float> v, bool normalize, int64_t dimensions) {
  auto unit = [](std::vector<float>& x) {
    double ss = 0;
    for (float f : x) ss += static_cast<double>(f) * static_cast<double>(f);
    if (ss <= 0) return;
    const double norm = std::sqrt(ss);
    for (float& f : x) f = static_cast<float>(static_cast<double>(f) / norm);
  };
  std::vector<float> out(v.begin(), v.end());
  if (normalize) unit(out);
  if (dimensions > 0 && dimensions < static_cast<int64_t>(out.size())) {
    out.resize(static_cast<std::size_t>(dimensions));
    unit(out);
  }
  return out;
}

std::string base64_floats(std::span<const float> v) {
  static const char* const kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());  // little-endian: every platform Tandem builds on
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t b0 = bytes[i], b1 = i + 1 < bytes.size() ? bytes[i + 1] : 0, b2 = i + 2 < bytes.size() ? bytes[i + 2] : 0;
    const uint32_t n = (b0 << 16) | (b1 << 8) | b2;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

EmbeddingResult embedding_result_of(const BatchRequest& req, const std::vector<float>& pooled, int64_t hidden,
                                    const EmbeddingPooling& pooling, double e2e_s, int64_t computed, int worker) {
  EmbeddingResult r;
  const auto H = static_cast<std::size_t>(hidden);
  if (H == 0 || pooled.size() != req.input_ids.size() * H)
    throw Error("internal: " + std::to_string(pooled.size()) + " pooled values for " +
                std::to_string(req.input_ids.size()) + " inputs of " + std::to_string(H));
  for (std::size_t i = 0; i < req.input_ids.size(); ++i) {
    r.vectors.push_back(finish_embedding(std::span<const float>(pooled.data() + i * H, H), pooling.normalize, req.dimensions));
    r.prompt_tokens += static_cast<int64_t>(req.input_ids[i].size());
  }
  r.e2e_ms = e2e_s * 1e3;
  r.prompt_tokens_computed = computed;
  r.worker = worker;
  return r;
}

json embedding_body(const BatchRequest& req, const EmbeddingResult& res, const OutputContext& ctx) {
  json data = json::array();
  for (std::size_t i = 0; i < res.vectors.size(); ++i) {
    const auto& v = res.vectors[i];
    data.push_back({{"object", "embedding"},
                    {"index", i},
                    {"embedding", req.base64 ? json(base64_floats(v)) : json(v)}});
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", req.model.empty() ? ctx.served_name : req.model},
          {"usage", {{"prompt_tokens", res.prompt_tokens}, {"total_tokens", res.prompt_tokens}}}};
}

std::string format_embedding(const BatchRequest& req, const EmbeddingResult& res, const OutputContext& ctx) {
  json line = {{"id", derived_id("batch_req_", req.custom_id)},
               {"custom_id", req.custom_id},
               {"response",
                {{"status_code", 200}, {"request_id", derived_id("req_", req.custom_id)}, {"body", embedding_body(req, res, ctx)}}},
               {"error", nullptr},
               {"tandem",
                {{"e2e_ms", res.e2e_ms}, {"prompt_tokens_computed", res.prompt_tokens_computed}, {"worker", res.worker}}}};
  return line.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace tandem::router
