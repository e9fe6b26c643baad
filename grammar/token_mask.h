// Which tokens a grammar allows next, for a model's vocabulary.
//
// A token is allowed when the grammar can read all its bytes from the
// sequence's state. Checking every token at every step would read the whole
// vocabulary; instead, for each automaton node the tokens are sorted into
// three sets once (xgrammar's adaptive mask cache): accepted (read entirely
// inside the node's own rule, whatever called it), rejected, and uncertain
// (the rule ends inside the token, so the caller's stack decides). A step
// then ORs the accepted sets of its stack tops and checks only the uncertain
// tokens against the real stack. The sets are computed the first time a node
// is a top, with the vocabulary walked in sorted order so tokens that share a
// prefix share its steps. The end tokens are allowed exactly where the root
// rule may end.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/matcher.h"

namespace tandem::grammar {

// A model's vocabulary as bytes. Immutable; shared by every grammar compiled for the model.
class Vocabulary {
 public:
  // bytes[id]: what token `id` spells (empty: never allowed); `ends`: the ids
  // that end a sequence, allowed only where the grammar may end (their bytes
  // are ignored); `specials`: special tokens, which a grammar reads only where
  // it names them (<[ID]>): they spell special_token_spelling(id), and an
  // ordinary token holding the byte 0xFF is never allowed, so no run of
  // ordinary tokens spells a special one.
  Vocabulary(std::vector<std::string> bytes, std::vector<int32_t> ends, const std::vector<int32_t>& specials = {});

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<std::size_t>(id)]; }
  bool is_end(int32_t id) const;
  const std::vector<int32_t>& ends() const { return ends_; }
  const std::vector<int32_t>& sorted() const { return sorted_; }  // ids with bytes, ordered by their bytes
  const std::vector<uint32_t>& lcp() const { return lcp_; }       // [i]: bytes sorted[i-1] and sorted[i] share
  // sorted()[i]'s bytes, from one contiguous buffer in sorted order (a walk of
  // the vocabulary reads memory in order instead of chasing 150k strings).
  std::string_view sorted_bytes(std::size_t i) const {
    return std::string_view(packed_).substr(offsets_[i], offsets_[i + 1] - offsets_[i]);
  }
  std::size_t mask_words() const { return (bytes_.size() + 63) / 64; }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> ends_;
  std::vector<int32_t> sorted_;
  std::vector<uint32_t> lcp_;
  std::string packed_;             // the sorted tokens' bytes, one after another
  std::vector<uint32_t> offsets_;  // [i, i+1): sorted()[i]'s bytes in packed_
};

// A grammar against a vocabulary, with its per-node token sets. Thread-safe;
// shared by every sequence that uses the grammar.
class CompiledGrammar {
 public:
  struct NodeTokens {
    std::vector<uint64_t> accepted;  // bitmask over the vocabulary
    std::vector<int32_t> uncertain;  // ids, sorted
  };

  CompiledGrammar(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> v);

  const Grammar& grammar() const { return *grammar_; }
  std::shared_ptr<const Grammar> grammar_ptr() const { return grammar_; }
  const Vocabulary& vocabulary() const { return *vocab_; }
  // The node's token sets; the first call for a node computes them (one walk
  // of the vocabulary), later calls return at once.
  const NodeTokens& node_tokens(int32_t node) const;
  std::size_t nodes_cached() const;

 private:
  NodeTokens compute(int32_t node) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  // One slot per node, computed once; threads computing different nodes do not wait on each other.
  struct Slot {
    std::once_flag once;
    std::unique_ptr<NodeTokens> tokens;
  };
  mutable std::mutex mu_;  // guards the map, not the computing
  mutable std::unordered_map<int32_t, std::unique_ptr<Slot>> cache_;
};

// One sequence's tokens through a compiled grammar. Not thread-safe.
class TokenMatcher {
 public:
  explicit TokenMatcher(std::shared_ptr<const CompiledGrammar> g);

  // mask.size() == vocabulary().mask_words(); bit id set = allowed next.
  // After an end token nothing is allowed.
  void fill_mask(std::vector<uint64_t>& mask);
  // False (and no change) when the token is not allowed.
  bool accept_token(int32_t id);
  bool can_end() const { return !ended_ && matcher_.can_end(); }
  bool ended() const { return ended_; }
  // Only an end token may follow.
  bool finished() const { return ended_ || matcher_.finished(); }
  void rollback(std::size_t n_tokens);

 private:
  std::shared_ptr<const CompiledGrammar> g_;
  Matcher matcher_;
  bool ended_ = false;
  std::vector<bool> accepted_end_;  // per accepted token: was it an end (for rollback)
};

}  // namespace tandem::grammar
