// tokenizer.json's `model` of type BPE: vocabulary, ranked merges, and the
// merge loop that turns one pre-tokenized word into token ids.
//
// Two spellings of the vocabulary are handled:
//  - byte-level (Qwen2/3, Llama 3): tokens spell bytes in GPT-2's alphabet;
//    they are converted to raw bytes at load, and a word starts as its bytes.
//  - SentencePiece-style (Mistral, Llama 2): tokens are text with "▁" for
//    space; a word starts as its characters, with `<0xNN>` byte tokens for
//    characters not in the vocabulary (byte_fallback) or the unk token.
// Merges may be given as "a b" strings or ["a", "b"] pairs. `ignore_merges`
// (Llama 3) emits a word that is itself in the vocabulary as one token.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tandem::runtime {

class BpeModel {
 public:
  // Throws tandem::Error naming `where` on an unsupported option or a merge
  // that names tokens missing from the vocabulary.
  BpeModel(const nlohmann::json& spec, bool byte_level, const std::string& where);

  // Appends the ids of one word to out. Thread-safe (the word cache is locked).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  // The id of a token as spelled in tokenizer.json, or -1.
  int32_t token_to_id(std::string_view token) const;
  // The token as spelled in tokenizer.json ("Ġhello", "▁hello", "<0x0A>"); "" when unknown.
  const std::string& id_to_token(int32_t id) const;
  // One past the largest id in the vocabulary.
  int32_t vocab_end() const { return static_cast<int32_t>(tokens_.size()); }
  bool byte_level() const { return byte_level_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Merges symbols in place, lowest rank first, leftmost first among equals.
  void merge(std::vector<int32_t>& symbols) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const;

  bool byte_level_;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  std::unordered_map<std::string, int32_t> vocab_;  // key: raw bytes (byte-level) or the file's spelling
  std::vector<std::string> tokens_;                 // id -> the file's spelling
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // byte-level: single bytes; SentencePiece: <0xNN> tokens

  // Words already merged, in shards by the word's hash so that threads
  // tokenizing at once (rank 0's line preparation) seldom wait on one lock.
  static constexpr std::size_t kCacheShards = 16;
  static constexpr std::size_t kCacheCapacity = (1 << 16) / kCacheShards;  // per shard
  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace tandem::runtime
