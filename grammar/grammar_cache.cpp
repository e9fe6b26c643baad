#include "grammar/grammar_cache.h"

namespace tandem::grammar {

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocab, std::size_t max_grammars)
    : vocab_(std::move(vocab)), max_(max_grammars) {}

std::shared_ptr<const CompiledGrammar> GrammarCache::get(const std::string& ebnf) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto it = map_.find(ebnf); it != map_.end()) {
      order_.splice(order_.begin(), order_, it->second.second);
      ++hits_;
      return it->second.first;
    }
    ++misses_;
  }
  auto compiled = std::make_shared<const CompiledGrammar>(Grammar::from_ebnf(ebnf), vocab_);  // outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = map_.find(ebnf); it != map_.end()) return it->second.first;  // another thread was first
  order_.push_front(ebnf);
  map_.emplace(ebnf, std::make_pair(compiled, order_.begin()));
  while (map_.size() > max_) {
    map_.erase(order_.back());
    order_.pop_back();
  }
  return compiled;
}

std::size_t GrammarCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

std::size_t GrammarCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace tandem::grammar
