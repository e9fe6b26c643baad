// tokenizer.json's `added_tokens` (special tokens such as <|im_start|> and
// plain added tokens such as <think>): found in the input before anything
// else runs, leftmost-longest as Hugging Face's Aho-Corasick matcher finds
// them, with the lstrip / rstrip / single_word options applied.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tandem::runtime {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool normalized = false;  // matched on normalized text (else on the raw input)
  bool lstrip = false, rstrip = false, single_word = false;
};

class AddedTokens {
 public:
  AddedTokens() = default;
  AddedTokens(const nlohmann::json& list, const std::string& where);

  // Splits text into stretches: on_text(begin, end) for text between tokens
  // and on_token(id, begin, end) for a token; covers text in order. `normalized`
  // selects the tokens matched on normalized text (else the raw-text ones).
  void split(std::string_view text, bool normalized, const std::function<void(std::size_t, std::size_t)>& on_text,
             const std::function<void(int32_t)>& on_token) const;

  bool has_normalized() const { return !tries_[1].empty(); }
  const AddedToken* find(int32_t id) const;
  int32_t find(std::string_view content) const;  // -1 when absent
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Node {
    std::unordered_map<unsigned char, int32_t> next;
    int32_t token = -1;  // index into tokens_ ending here
  };
  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, std::size_t> by_id_;
  std::vector<Node> tries_[2];  // [0]: raw-text tokens, [1]: normalized-text tokens; node 0 is the root
  bool first_byte_[2][256] = {};
};

}  // namespace tandem::runtime
