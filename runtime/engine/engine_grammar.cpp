// Structured outputs in the engine: a request's grammar compiled (cached by
// its text, for this model's vocabulary), its sequence's matcher started and
// fed, and each step's row masked to what the grammar allows.
#include <algorithm>
#include <limits>

#include "common/error.h"
#include "grammar/grammar_cache.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_sequence.h"

namespace tandem::runtime {

std::shared_ptr<const grammar::CompiledGrammar> Engine::grammar_of(const SamplingParams& p) const {
  if (p.grammar.empty()) return nullptr;
  if (!tokenizer_) throw Error("a structured output needs the model's tokenizer, and this engine has none");
  if (!grammars_) {
    std::vector<std::string> bytes(static_cast<std::size_t>(config_.vocab));
    std::vector<int32_t> specials;  // read by a grammar only where it names them (<[ID]>: Mistral's [TOOL_CALLS])
    for (int32_t id = 0; id < config_.vocab && id < tokenizer_->vocab_size(); ++id) {
      bytes[static_cast<std::size_t>(id)] = tokenizer_->token_bytes(id);
      if (tokenizer_->is_special(id)) specials.push_back(id);
    }
    grammars_ = std::make_unique<grammar::GrammarCache>(
        std::make_shared<grammar::Vocabulary>(std::move(bytes), config_.eos_token_ids, specials));
  }
  return grammars_->get(p.grammar);
}

void Engine::start_grammar(Sequence& s) const {
  auto g = grammar_of(s.req.params);
  if (!g) return;
  s.matcher = std::make_unique<grammar::TokenMatcher>(g);
  if (!s.req.params.stop.empty()) {
    s.text_grammar = std::make_unique<grammar::Matcher>(g->grammar_ptr());
    s.text_ends.assign(1, s.text_grammar->can_end());
    s.stop_from.assign(s.req.params.stop.size(), 0);
  }
}

void Engine::follow_grammar(Sequence& s, int32_t token) const {
  if (!s.matcher || ends_output(s.req.params, token)) return;
  if (!s.matcher->accept_token(token)) {  // the mask allowed only what the grammar reads: a bug if reached
    throw Error("request " + std::to_string(s.req.id) + ": token " + std::to_string(token) +
                " was drawn outside its grammar (an engine bug; please report it)");
  }
}

void Engine::apply_grammar(const Sequence& s, std::span<float> lg) const {
  const std::size_t vocab = lg.size();
  thread_local std::vector<uint64_t> mask;
  mask.resize((vocab + 63) / 64);
  s.matcher->fill_mask(mask);
  const bool can_end = s.matcher->can_end();
  for (const int32_t t : s.req.params.stop_token_ids) {  // this request's ends: only where the grammar may end
    uint64_t& word = mask[static_cast<std::size_t>(t) / 64];
    const uint64_t bit = uint64_t{1} << (t % 64);
    word = can_end ? (word | bit) : (word & ~bit);
  }
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  for (std::size_t w = 0; w * 64 < vocab; ++w) {  // a word at a time: most are all allowed or all banned
    const uint64_t bits = mask[w];
    const std::size_t end = std::min(vocab, (w + 1) * 64);
    if (bits == ~uint64_t{0} && end == (w + 1) * 64) continue;
    for (std::size_t t = w * 64; t < end; ++t) {
      if (!((bits >> (t % 64)) & 1)) lg[t] = kBanned;
    }
  }
}

}  // namespace tandem::runtime
