// Tokenizer: a model directory's tokenizer.json (+ tokenizer_config.json),
// producing exactly the ids Hugging Face's `tokenizers` produces.
//
// encode: added tokens are split out of the raw text first; each stretch
// between them is normalized, pre-tokenized and run through BPE; with
// add_special_tokens the post-processor then adds BOS/EOS as the file says.
// decode: ids -> token strings -> the file's decoder chain.
//
// Thread-safety: a loaded Tokenizer is immutable apart from an internally
// locked word cache; encode and decode may run on many threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tandem::runtime {

class Normalizer;
class PreTokenizer;
class Decoder;
class BpeModel;
class AddedTokens;

// What tokenizer_config.json says that Tandem uses.
struct TokenizerConfig {
  std::string chat_template;  // raw Jinja text; empty when the model has none
  std::string bos_token;      // content, e.g. "<|begin_of_text|>"; empty when none
  std::string eos_token;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  // Throws tandem::Error with one line naming the file and what is wrong.
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& model_dir);
  // From the text of a tokenizer.json; `where` names it in errors.
  static std::unique_ptr<Tokenizer> from_json(std::string_view tokenizer_json, const std::string& where,
                                              TokenizerConfig config = {});
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when unknown
  std::string id_to_token(int32_t id) const;          // "" when unknown
  // The bytes token `id` adds to the text after other tokens (what a grammar
  // reads): byte-level vocabularies mapped back to bytes, SentencePiece's
  // U+2581 as a space and <0xNN> as the byte. "" for a special token or an
  // unknown id: a grammar never allows one.
  std::string token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;                   // an added token marked special
  int32_t vocab_size() const;                          // one past the largest id
  const TokenizerConfig& config() const { return config_; }
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

 private:
  Tokenizer();
  void parse(const nlohmann::json& doc, const std::string& where);
  void encode_stretch(std::string_view text, bool at_input_start, std::vector<int32_t>& out) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<AddedTokens> added_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // post-processor, single sequence
  TokenizerConfig config_;
};

// Incremental detokenization for streaming: feed ids one at a time, get text
// only once it is complete UTF-8 and will not change, so no character is ever
// split across chunks. The concatenation of every push() and finish() equals
// decode(all ids).
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

  std::string push(int32_t id);
  // What is still held back (an incomplete character at the very end).
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  std::size_t prefix_ = 0;  // ids_[prefix_, read_) were decoded already as context
  std::size_t read_ = 0;    // ids_[read_, end) are not yet emitted
  std::string emitted_;     // everything push() has returned
};

}  // namespace tandem::runtime
