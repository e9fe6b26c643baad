#include "runtime/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/tokenizer/byte_level.h"
#include "runtime/tokenizer/utf8.h"

namespace tandem::runtime {

BpeModel::BpeModel(const nlohmann::json& spec, bool byte_level, const std::string& where) : byte_level_(byte_level) {
  auto opt_string = [&](const char* key) {
    return spec.contains(key) && spec[key].is_string() ? spec[key].get<std::string>() : std::string();
  };
  if (!opt_string("continuing_subword_prefix").empty() || !opt_string("end_of_word_suffix").empty()) {
    throw Error(where + ": BPE with continuing_subword_prefix or end_of_word_suffix is not supported");
  }
  if (spec.contains("dropout") && !spec["dropout"].is_null() && spec["dropout"].get<double>() > 0) {
    throw Error(where + ": BPE dropout is not supported (it makes tokenization random)");
  }
  ignore_merges_ = spec.value("ignore_merges", false);
  byte_fallback_ = spec.value("byte_fallback", false);
  fuse_unk_ = spec.value("fuse_unk", false);

  const auto& vocab = spec.at("vocab");
  if (!vocab.is_object()) throw Error(where + ": model.vocab must be an object of token -> id");
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) max_id = std::max(max_id, it.value().get<int32_t>());
  tokens_.resize(static_cast<std::size_t>(max_id + 1));
  vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = it.value().get<int32_t>();
    if (id < 0) throw Error(where + ": model.vocab has a negative id for '" + it.key() + "'");
    tokens_[static_cast<std::size_t>(id)] = it.key();
    if (byte_level_) {
      auto bytes = byte_level_to_bytes(it.key());
      vocab_.emplace(bytes ? *bytes : it.key(), id);
    } else {
      vocab_.emplace(it.key(), id);
    }
  }

  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (byte_level_) {
      auto it = vocab_.find(std::string(1, static_cast<char>(b)));
      if (it == vocab_.end()) throw Error(where + ": byte-level vocabulary lacks byte " + std::to_string(b));
      byte_ids_[static_cast<std::size_t>(b)] = it->second;
    } else {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      if (auto it = vocab_.find(name); it != vocab_.end()) byte_ids_[static_cast<std::size_t>(b)] = it->second;
    }
  }
  if (auto unk = opt_string("unk_token"); !unk.empty()) unk_id_ = token_to_id(unk);

  const auto& merges = spec.at("merges");
  merges_.reserve(merges.size());
  int32_t rank = 0;
  for (const auto& m : merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const auto sp = s.find(' ', 1);
      if (sp == std::string::npos) throw Error(where + ": merge '" + s + "' is not of the form \"a b\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      throw Error(where + ": merge #" + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const int32_t ia = token_to_id(a), ib = token_to_id(b), ic = token_to_id(a + b);
    if (ia < 0 || ib < 0 || ic < 0) {
      throw Error(where + ": merge #" + std::to_string(rank) + " (\"" + a + "\", \"" + b +
                  "\") uses a token missing from model.vocab");
    }
    merges_.emplace(pair_key(ia, ib), Merge{rank, ic});
    ++rank;
  }
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  if (byte_level_) {
    auto bytes = byte_level_to_bytes(token);
    auto it = vocab_.find(bytes ? *bytes : std::string(token));
    return it == vocab_.end() ? -1 : it->second;
  }
  auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

const std::string& BpeModel::id_to_token(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < vocab_end() ? tokens_[static_cast<std::size_t>(id)] : kEmpty;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  if (byte_level_) {
    for (unsigned char c : word) symbols.push_back(byte_ids_[c]);
    return;
  }
  bool pending_unk = false;  // fuse_unk: consecutive unknown characters become one unk
  std::string ch;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t n = std::min(utf8_char_len(static_cast<unsigned char>(word[i])), word.size() - i);
    ch.assign(word.substr(i, n));
    i += n;
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      symbols.push_back(it->second);
      pending_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : ch) all = all && byte_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : ch) symbols.push_back(byte_ids_[c]);
        pending_unk = false;
        continue;
      }
    }
    if (unk_id_ < 0) continue;  // no unk token: the character is dropped, as Hugging Face does
    if (!(fuse_unk_ && pending_unk)) symbols.push_back(unk_id_);
    pending_unk = true;
  }
}

void BpeModel::merge(std::vector<int32_t>& symbols) const {
  const int n = static_cast<int>(symbols.size());
  if (n < 2) return;
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    auto it = merges_.find(pair_key(symbols[i], symbols[next[i]]));
    if (it != merges_.end()) queue.push({it->second.rank, i, it->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    const int i = c.pos;
    if (!alive[i] || next[i] < 0) continue;
    auto it = merges_.find(pair_key(symbols[i], symbols[next[i]]));
    if (it == merges_.end() || it->second.new_id != c.new_id) continue;  // stale entry
    const int j = next[i];
    symbols[i] = c.new_id;
    alive[j] = false;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    consider(prev[i]);
    consider(i);
  }
  std::size_t w = 0;
  for (int i = 0; i < n; ++i)
    if (alive[i]) symbols[w++] = symbols[i];
  symbols.resize(w);
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const std::string key(word);
  CacheShard& shard = cache_[std::hash<std::string_view>{}(word) % kCacheShards];
  {
    std::lock_guard lock(shard.mutex);
    if (auto it = shard.words.find(key); it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  initial_symbols(word, symbols);
  merge(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  std::lock_guard lock(shard.mutex);
  if (shard.words.size() >= kCacheCapacity) shard.words.clear();
  shard.words.emplace(key, std::move(symbols));
}

}  // namespace tandem::runtime
