// Compiled grammars by their EBNF text, for one vocabulary: a batch file
// usually repeats one schema on every line, so it is compiled (and its token
// sets computed) once. Thread-safe.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "grammar/token_mask.h"

namespace tandem::grammar {

class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const Vocabulary> vocab, std::size_t max_grammars = 64);

  // Compiles on a miss (throws tandem::Error for a bad grammar); the least
  // recently used grammar is dropped past max_grammars (sequences using it keep it alive).
  std::shared_ptr<const CompiledGrammar> get(const std::string& ebnf);
  const Vocabulary& vocabulary() const { return *vocab_; }
  std::size_t hits() const;
  std::size_t misses() const;

 private:
  std::shared_ptr<const Vocabulary> vocab_;
  std::size_t max_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // most recent first
  std::unordered_map<std::string, std::pair<std::shared_ptr<const CompiledGrammar>, std::list<std::string>::iterator>> map_;
  std::size_t hits_ = 0, misses_ = 0;
};

}  // namespace tandem::grammar
