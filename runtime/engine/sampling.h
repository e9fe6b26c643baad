// Sampling: from one row of logits to the next token, reproducibly.
//
// Randomness comes from a counter-based generator keyed by (request key,
// step): a request draws the same numbers whatever shares its batch, however
// often it is preempted and recomputed, and on whichever rank it runs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tandem::runtime {

struct SamplingParams {
  int64_t max_tokens = 16;
  float temperature = 1.0f;         // 0: greedy (ties go to the lowest id)
  float top_p = 1.0f;
  int64_t top_k = 0;                // 0 or -1: off
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // > 1 discourages tokens seen in prompt or output
  uint64_t seed = 0;                // with the request's identity, keys the generator
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;    // stop strings (not included in the output text)
  bool ignore_eos = false;
  int64_t logprobs = -1;            // -1: none; n >= 0: the sampled token's plus the top n
  int64_t prompt_logprobs = -1;     // -1: none; n >= 0: for every prompt token (echo / scoring)
  // (token id, bias) sorted by id: added to the token's logit before penalties
  // and temperature (OpenAI's logit_bias, -100..100; -100 bans, 100 forces).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Before this many tokens are out, EOS (unless ignore_eos) and
  // stop_token_ids cannot be drawn and no stop string ends the output (vLLM's min_tokens).
  int64_t min_tokens = 0;
  // A structured output: the EBNF (grammar/ebnf.h) the tokens must spell;
  // empty: unconstrained. Tokens the grammar does not allow next are set to
  // -inf after logit_bias, the end tokens (EOS, stop_token_ids) are allowed
  // only where it may end, and a stop string ends the output only where the
  // text before it is complete. Logprobs stay those of the raw logits.
  std::string grammar;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// The log-probabilities one position gives: the chosen token's and the top n.
struct PositionLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // best first; ties by lower id
};

// A uniform double in [0, 1) for (key, step): splitmix64 of the pair.
double counter_uniform(uint64_t key, uint64_t step);

// logit_bias and min_tokens on one row of logits, in place, before
// sample_token: the biases added, and while fewer than min_tokens tokens are
// out (`generated`), the stop tokens set to -inf (`eos`: the model's end
// tokens, banned too unless ignore_eos). A row's result depends only on the
// row and the request, so batches stay invariant. The logprobs a request
// asks for are of the raw logits, before this.
void apply_logit_rules(std::span<float> logits, const SamplingParams& p, int64_t generated,
                       std::span<const int32_t> eos);
// True when apply_logit_rules may change a row at this point of the request.
inline bool has_logit_rules(const SamplingParams& p, int64_t generated) {
  return !p.logit_bias.empty() || generated < p.min_tokens;
}

// Applies penalties, temperature, top-k, top-p and min-p to `logits` (in
// place) and picks a token. `prompt` and `output` are the sequence so far.
int32_t sample_token(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> prompt,
                     std::span<const int32_t> output, uint64_t key, uint64_t step);

// log_softmax of raw logits: the chosen token's logprob and the top n.
PositionLogprobs logprobs_of(std::span<const float> logits, int32_t chosen, int64_t n);

}  // namespace tandem::runtime
