#include "runtime/tokenizer/tokenizer.h"

#include <cctype>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/tokenizer/added_tokens.h"
#include "runtime/tokenizer/bpe_model.h"
#include "runtime/tokenizer/byte_level.h"
#include "runtime/tokenizer/decoder.h"
#include "runtime/tokenizer/normalizer.h"
#include "runtime/tokenizer/pieces.h"
#include "runtime/tokenizer/pre_tokenizer.h"
#include "runtime/tokenizer/utf8.h"

namespace tandem::runtime {
namespace {

std::string read_text(const std::filesystem::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(path.string() + ": cannot read " + what +
                (std::filesystem::exists(path) ? "" : " (missing; copy it from the model's Hugging Face checkpoint)"));
  }
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json parse_json(std::string_view text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(where + ": not valid JSON at byte " + std::to_string(e.byte) +
                " (truncated or corrupt? re-download it)");
  }
}

// A token named in tokenizer_config.json: a string or {"content": ...}.
std::string token_content(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& model_dir) {
  if (!std::filesystem::is_directory(model_dir)) {
    throw Error(model_dir.string() + ": not a directory; give a Hugging Face model directory (with tokenizer.json)");
  }
  const auto tok_path = model_dir / "tokenizer.json";
  const std::string text = read_text(tok_path, "the tokenizer");
  TokenizerConfig config;
  const auto cfg_path = model_dir / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) {
    const auto cfg = parse_json(read_text(cfg_path, "the tokenizer config"), cfg_path.string());
    if (cfg.contains("chat_template")) {
      const auto& t = cfg["chat_template"];
      if (t.is_string()) {
        config.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // named templates: take "default"
        for (const auto& entry : t)
          if (entry.value("name", "") == "default") config.chat_template = entry.value("template", "");
      }
    }
    config.bos_token = token_content(cfg, "bos_token");
    config.eos_token = token_content(cfg, "eos_token");
  }
  return from_json(text, tok_path.string(), std::move(config));
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json, const std::string& where,
                                                TokenizerConfig config) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->config_ = std::move(config);
  const auto doc = parse_json(tokenizer_json, where);
  try {
    t->parse(doc, where);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": unexpected structure (" + e.what() + ")");
  }
  return t;
}

void Tokenizer::parse(const nlohmann::json& doc, const std::string& where) {
  if (!doc.is_object() || !doc.contains("model")) throw Error(where + ": no \"model\" section; is this a tokenizer.json?");
  const auto& model = doc["model"];
  const std::string type = model.value("type", model.contains("merges") ? "BPE" : "");
  if (type != "BPE") {
    throw Error(where + ": model type '" + type +
                "' is not supported (Tandem reads BPE tokenizers: Qwen2/3, Llama 3, Mistral, Llama 2)");
  }
  added_ = std::make_unique<AddedTokens>(doc.value("added_tokens", nlohmann::json()), where);
  normalizer_ = make_normalizer(doc.value("normalizer", nlohmann::json()), where);
  PreTokenizerInfo info;
  pre_tokenizer_ = make_pre_tokenizer(doc.value("pre_tokenizer", nlohmann::json()), where, info);
  const auto decoder = doc.value("decoder", nlohmann::json());
  const bool byte_level = info.byte_level || (decoder.is_object() && decoder.value("type", "") == "ByteLevel");
  model_ = std::make_unique<BpeModel>(model, byte_level, where);
  decoder_ = make_decoder(decoder, where);

  // Post-processor: what add_special_tokens puts around a single sequence.
  std::function<void(const nlohmann::json&)> post = [&](const nlohmann::json& p) {
    if (p.is_null()) return;
    const std::string ptype = p.value("type", "");
    if (ptype == "ByteLevel") return;  // changes offsets only
    if (ptype == "Sequence") {
      for (const auto& s : p.at("processors")) post(s);
      return;
    }
    if (ptype != "TemplateProcessing") {
      throw Error(where + ": post_processor type '" + ptype +
                  "' is not supported (supported: TemplateProcessing, ByteLevel, Sequence)");
    }
    prefix_ids_.clear();
    suffix_ids_.clear();
    bool seen_sequence = false;
    for (const auto& piece : p.at("single")) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      const auto& spec = p.at("special_tokens").at(name);
      auto& target = seen_sequence ? suffix_ids_ : prefix_ids_;
      for (const auto& id : spec.at("ids")) target.push_back(id.get<int32_t>());
    }
  };
  post(doc.value("post_processor", nlohmann::json()));
}

void Tokenizer::encode_stretch(std::string_view text, bool at_input_start, std::vector<int32_t>& out) const {
  Pieces pieces;
  std::string_view view = text;
  if (normalizer_) {
    std::string normalized(text);
    normalizer_->normalize(normalized);
    view = pieces.keep(std::move(normalized));
  }
  auto run = [&](std::string_view stretch, bool start) {
    pieces.list.assign(1, Piece{stretch, start});
    if (pre_tokenizer_) pre_tokenizer_->apply(pieces);
    for (const auto& p : pieces.list) model_->tokenize(p.text, out);
  };
  if (!added_->has_normalized()) {
    run(view, at_input_start);
    return;
  }
  // Tokens flagged `normalized` are matched after normalization.
  const std::string stretch(view);
  added_->split(
      stretch, true, [&](std::size_t b, std::size_t e) { run(std::string_view(stretch).substr(b, e - b), at_input_start && b == 0); },
      [&](int32_t id) { out.push_back(id); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out.insert(out.end(), prefix_ids_.begin(), prefix_ids_.end());
  added_->split(
      text, false, [&](std::size_t b, std::size_t e) { encode_stretch(text.substr(b, e - b), b == 0, out); },
      [&](int32_t id) { out.push_back(id); });
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* t = added_->find(id)) {
      if (!(skip_special_tokens && t->special)) tokens.push_back(t->content);
      continue;
    }
    const std::string& s = model_->id_to_token(id);
    if (!s.empty()) tokens.push_back(s);
  }
  if (!decoder_) {
    std::string joined;
    for (std::size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  decoder_->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  const int32_t added = added_->find(token);
  return added >= 0 ? added : model_->token_to_id(token);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (const AddedToken* t = added_->find(id)) return t->special ? std::string() : t->content;
  const std::string& s = model_->id_to_token(id);
  if (model_->byte_level()) {
    if (auto b = byte_level_to_bytes(s)) return *b;
    return s;
  }
  if (s.size() == 6 && s.starts_with("<0x") && s.back() == '>' && std::isxdigit(static_cast<unsigned char>(s[3])) &&
      std::isxdigit(static_cast<unsigned char>(s[4]))) {
    return std::string(1, static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)));
  }
  std::string out;
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  for (std::size_t i = 0; i < s.size();) {
    if (s.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* t = added_->find(id)) return t->content;
  return model_->id_to_token(id);
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* t = added_->find(id);
  return t && t->special;
}

int32_t Tokenizer::vocab_size() const {
  int32_t n = model_->vocab_end();
  for (const auto& t : added_->tokens()) n = std::max(n, t.id + 1);
  return n;
}

std::optional<int32_t> Tokenizer::bos_id() const {
  if (config_.bos_token.empty()) return std::nullopt;
  const int32_t id = token_to_id(config_.bos_token);
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}

std::optional<int32_t> Tokenizer::eos_id() const {
  if (config_.eos_token.empty()) return std::nullopt;
  const int32_t id = token_to_id(config_.eos_token);
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  const std::string before = tokenizer_.decode(all.subspan(prefix_, read_ - prefix_), skip_special_);
  const std::string now = tokenizer_.decode(all.subspan(prefix_), skip_special_);
  // Hold back while the newest bytes are an unfinished character: the
  // decoder shows them as U+FFFD until the rest arrives.
  if (now.size() <= before.size() || now.ends_with("\xEF\xBF\xBD") || now.compare(0, before.size(), before) != 0) {
    return "";
  }
  prefix_ = read_;
  read_ = ids_.size();
  std::string chunk = now.substr(before.size());
  emitted_ += chunk;
  return chunk;
}

std::string StreamDecoder::finish() {
  // One full decode settles whatever the window held back.
  const std::string full = tokenizer_.decode(ids_, skip_special_);
  prefix_ = read_ = ids_.size();
  if (full.size() <= emitted_.size() || full.compare(0, emitted_.size(), emitted_) != 0) return "";
  std::string rest = full.substr(emitted_.size());
  emitted_ = full;
  return rest;
}

}  // namespace tandem::runtime
