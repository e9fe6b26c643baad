// The engine's view of one request (internal to engine*.cpp).
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "kv/block_hash.h"
#include "runtime/engine/engine.h"

namespace tandem::runtime {

using Clock = std::chrono::steady_clock;

struct Engine::Sequence {
  EngineRequest req;
  uint64_t arrival = 0;
  std::vector<int32_t> tokens;  // prompt, then generated
  int64_t n_prompt = 0;
  int64_t computed = 0;         // tokens whose K/V are in the pool
  std::vector<int32_t> blocks;
  std::vector<PositionLogprobs> logprobs, prompt_logprobs;
  std::optional<StreamDecoder> decoder;
  std::string text;
  bool stop_string_hit = false;
  Clock::time_point added, first_token;
  bool has_first = false;
  int64_t preemptions = 0;
  int64_t prompt_computed = 0;  // prompt positions run through the model here (recomputation included)
  bool hits_counted = false;    // its prefix-cache hits are counted once, at its first admission on any rank
  std::size_t stop_text_from = 0;  // min_tokens: a stop string must end past this much of the text
  int64_t published = 0;        // leading blocks published in the prefix cache
  int64_t received = 0;         // leading blocks whose KV another rank computed (disaggregated prefill)
  uint64_t last_hash = kv::kRootHash;
  std::array<int64_t, kv::kTiers> cached_from{};  // blocks of the cached prefix, by tier
  bool done = false;
  // A structured output: the tokens through the grammar; and, when stop
  // strings are asked, the text through it too (text_ends[i]: the grammar may
  // end after i bytes of text), so a stop string cuts only complete output.
  std::unique_ptr<grammar::TokenMatcher> matcher;
  std::unique_ptr<grammar::Matcher> text_grammar;
  std::vector<char> text_ends;
  std::vector<std::size_t> stop_from;  // per stop string: occurrences before this were incomplete
  std::vector<float> pooled;           // an embedding: its pooling so far (kMean: the running sum)

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
  std::span<const int32_t> prompt() const { return {tokens.data(), static_cast<std::size_t>(n_prompt)}; }
  std::span<const int32_t> output() const {
    return {tokens.data() + n_prompt, static_cast<std::size_t>(generated())};
  }
};

}  // namespace tandem::runtime
