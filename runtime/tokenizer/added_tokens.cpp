#include "runtime/tokenizer/added_tokens.h"

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include "common/error.h"
#include "runtime/tokenizer/utf8.h"

namespace tandem::runtime {
namespace {

bool is_space(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool is_word_char(uint32_t cp) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO) ||
         (cat >= UTF8PROC_CATEGORY_MN && cat <= UTF8PROC_CATEGORY_ME);
}

// The code point that ends at position `end` of s.
uint32_t code_point_before(std::string_view s, std::size_t end, std::size_t& begin) {
  begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) --begin;
  std::size_t i = begin;
  return next_code_point(s, i);
}

}  // namespace

AddedTokens::AddedTokens(const nlohmann::json& list, const std::string& where) {
  for (auto& t : tries_) t.emplace_back();
  if (list.is_null()) return;
  if (!list.is_array()) throw Error(where + ": added_tokens must be an array");
  for (const auto& j : list) {
    AddedToken t;
    t.id = j.at("id").get<int32_t>();
    t.content = j.at("content").get<std::string>();
    t.special = j.value("special", false);
    t.normalized = j.value("normalized", !t.special);
    t.lstrip = j.value("lstrip", false);
    t.rstrip = j.value("rstrip", false);
    t.single_word = j.value("single_word", false);
    if (t.content.empty()) continue;
    const std::size_t index = tokens_.size();
    by_id_[t.id] = index;
    auto& trie = tries_[t.normalized ? 1 : 0];
    first_byte_[t.normalized ? 1 : 0][static_cast<unsigned char>(t.content[0])] = true;
    int32_t node = 0;
    for (unsigned char c : t.content) {
      auto it = trie[static_cast<std::size_t>(node)].next.find(c);
      if (it == trie[static_cast<std::size_t>(node)].next.end()) {
        trie.emplace_back();
        const auto child = static_cast<int32_t>(trie.size() - 1);
        trie[static_cast<std::size_t>(node)].next[c] = child;
        node = child;
      } else {
        node = it->second;
      }
    }
    trie[static_cast<std::size_t>(node)].token = static_cast<int32_t>(index);
    tokens_.push_back(std::move(t));
  }
  if (tries_[1].size() == 1) tries_[1].clear();
}

const AddedToken* AddedTokens::find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

int32_t AddedTokens::find(std::string_view content) const {
  for (const auto& t : tokens_)
    if (t.content == content) return t.id;
  return -1;
}

void AddedTokens::split(std::string_view text, bool normalized,
                        const std::function<void(std::size_t, std::size_t)>& on_text,
                        const std::function<void(int32_t)>& on_token) const {
  const auto& trie = tries_[normalized ? 1 : 0];
  const bool* first = first_byte_[normalized ? 1 : 0];
  std::size_t emitted = 0;  // text before this offset has been handed out
  std::size_t i = 0;
  while (i < text.size() && !trie.empty()) {
    if (!first[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    int32_t node = 0, best = -1;
    std::size_t best_end = 0;
    for (std::size_t k = i; k < text.size(); ++k) {
      auto it = trie[static_cast<std::size_t>(node)].next.find(static_cast<unsigned char>(text[k]));
      if (it == trie[static_cast<std::size_t>(node)].next.end()) break;
      node = it->second;
      if (trie[static_cast<std::size_t>(node)].token >= 0) {
        best = trie[static_cast<std::size_t>(node)].token;
        best_end = k + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[static_cast<std::size_t>(best)];
    std::size_t start = i, stop = best_end;
    if (tok.single_word) {
      std::size_t b = 0;
      const bool word_before = start > 0 && is_word_char(code_point_before(text, start, b));
      std::size_t k = stop;
      const bool word_after = stop < text.size() && is_word_char(next_code_point(text, k));
      if (word_before || word_after) {
        i = best_end;  // Aho-Corasick moved past this match; so do we
        continue;
      }
    }
    if (tok.lstrip) {
      while (start > emitted) {
        std::size_t b = 0;
        if (!is_space(code_point_before(text, start, b))) break;
        start = b;
      }
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        std::size_t k = stop;
        if (!is_space(next_code_point(text, k))) break;
        stop = k;
      }
    }
    if (start > emitted) on_text(emitted, start);
    on_token(tok.id);
    emitted = stop;
    i = stop;
  }
  if (emitted < text.size()) on_text(emitted, text.size());
}

}  // namespace tandem::runtime
