#include "runtime/engine/engine.h"

#include <algorithm>
#include <unordered_set>

#include "common/error.h"
#include "grammar/grammar_cache.h"
#include "kv/block_hash.h"
#include "runtime/engine/engine_sequence.h"

namespace tandem::runtime {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kPrefilled: return "prefilled";
  }
  return "";
}

Engine::Engine(const ModelConfig& config, const ModelWeights& weights, kv::BlockPool& pool, cpu::ThreadPool& threads,
               const Tokenizer* tokenizer, EngineOptions options)
    : Engine(config, std::make_unique<cpu::CpuModel>(config, weights, pool, threads), pool, tokenizer, options) {
  if (!options_.sampling_threads) options_.sampling_threads = &threads;
}

Engine::Engine(const ModelConfig& config, std::unique_ptr<ModelBackend> backend, kv::BlockPool& pool,
               const Tokenizer* tokenizer, EngineOptions options)
    : config_(config), pool_(pool), tokenizer_(tokenizer), options_(options),
      max_model_len_(options.max_model_len > 0 ? std::min(options.max_model_len, config.max_position_embeddings)
                                               : config.max_position_embeddings),
      model_(std::move(backend)) {}

Engine::~Engine() = default;

bool Engine::ends_output(const SamplingParams& p, int32_t t) const {
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end()) return true;
  return !p.ignore_eos &&
         std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), t) != config_.eos_token_ids.end();
}

void Engine::check(const EngineRequest& request) const {
  const auto n = static_cast<int64_t>(request.prompt.size());
  if (n == 0) throw Error("request " + std::to_string(request.id) + ": the prompt is empty");
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= config_.vocab)
      throw Error("request " + std::to_string(request.id) + ": token id " + std::to_string(t) +
                  " is outside the vocabulary (0.." + std::to_string(config_.vocab - 1) + ")");
  }
  for (const auto& [t, bias] : request.params.logit_bias) {
    if (t < 0 || t >= config_.vocab)
      throw Error("request " + std::to_string(request.id) + ": logit_bias names token " + std::to_string(t) +
                  ", outside the vocabulary (0.." + std::to_string(config_.vocab - 1) + ")");
  }
  for (int32_t t : request.params.stop_token_ids) {  // one that can never be drawn is a mistake, not a no-op
    if (t < 0 || t >= config_.vocab)
      throw Error("request " + std::to_string(request.id) + ": stop_token_ids has " + std::to_string(t) +
                  ", outside the vocabulary (0.." + std::to_string(config_.vocab - 1) + ")");
  }
  if (!request.params.grammar.empty()) {
    if (request.params.ignore_eos || request.params.min_tokens > 0) {
      throw Error("request " + std::to_string(request.id) +
                  ": ignore_eos and min_tokens cannot be combined with a structured output (the grammar decides where "
                  "the output ends)");
    }
    try {
      grammar_of(request.params);
    } catch (const Error& e) {
      throw Error("request " + std::to_string(request.id) + ": " + e.what());
    }
  }
  const bool embedding = request.pooling != Pooling::kNone;  // draws nothing: the whole context is the prompt's
  if (!embedding && !model_->has_lm_head())
    throw Error("request " + std::to_string(request.id) + ": this checkpoint has no lm_head (an embedding model): it "
                "answers /v1/embeddings only");
  if (embedding && !model_->has_hidden_rows())
    throw Error("request " + std::to_string(request.id) + ": embeddings are computed by the CPU backend for now; the " +
                std::string(model_->name()) + " backend does not give hidden states");
  if (n > max_model_len_ || (n == max_model_len_ && !embedding)) {
    throw Error("request " + std::to_string(request.id) + ": the prompt has " + std::to_string(n) +
                " tokens but the context holds " + std::to_string(max_model_len_) +
                " (shorten the prompt or raise model.max_model_len)");
  }
  // A request that could not finish even alone in the pool would be preempted forever: refuse it now.
  // (A prefill-only request stops after its first token.)
  const int64_t generated = embedding ? 0 : request.prefill_only ? 1 : std::max<int64_t>(1, request.params.max_tokens);
  const int64_t longest = std::min(n + generated, max_model_len_);
  const int64_t pool_tokens = pool_.capacity() * pool_.layout().block_size;
  if (longest > pool_tokens) {
    throw Error("request " + std::to_string(request.id) + ": needs up to " + std::to_string(longest) +
                " tokens of KV cache but the pool holds " + std::to_string(pool_tokens) +
                " (raise kv.memory_gib or lower max_tokens)");
  }
}

void Engine::add(EngineRequest request) {
  check(request);
  const auto n = static_cast<int64_t>(request.prompt.size());
  auto s = std::make_unique<Sequence>();
  s->req = std::move(request);
  s->arrival = arrivals_++;
  s->tokens = s->req.prompt;
  s->n_prompt = n;
  s->added = Clock::now();
  if (tokenizer_) s->decoder.emplace(*tokenizer_, true);
  if (s->req.params.prompt_logprobs >= 0) s->prompt_logprobs.resize(static_cast<std::size_t>(n - 1));
  start_grammar(*s);
  waiting_.push_back(std::move(s));
}

void Engine::cancel(uint64_t id) { aborted_.push_back(id); }

std::optional<std::vector<int32_t>> Engine::reserve_blocks(int64_t n_tokens) {
  const int64_t bs = pool_.layout().block_size;
  return pool_.allocate((n_tokens + bs - 1) / bs);
}

void Engine::release_blocks(const std::vector<int32_t>& blocks) { pool_.release(blocks); }

void Engine::add_prefilled(EngineRequest request, std::vector<int32_t> blocks, const PrefillHandoff& handoff,
                           Clock::time_point arrival) {
  auto s = std::make_unique<Sequence>();
  s->req = std::move(request);
  s->arrival = arrivals_++;
  s->tokens = s->req.prompt;
  s->n_prompt = static_cast<int64_t>(s->tokens.size());
  s->computed = s->n_prompt;
  s->received = s->n_prompt / pool_.layout().block_size;
  s->hits_counted = true;  // the prefill rank counted them
  s->blocks = std::move(blocks);
  s->added = arrival;
  s->first_token = Clock::now();
  s->has_first = true;
  s->logprobs = handoff.logprobs;
  s->prompt_logprobs = handoff.prompt_logprobs;
  if (tokenizer_) s->decoder.emplace(*tokenizer_, true);
  start_grammar(*s);
  s->tokens.push_back(handoff.first_token);
  follow_grammar(*s, handoff.first_token);  // the prefill rank drew it under the same grammar
  if (const auto reason = end_reason(*s)) {
    ready_.push_back(finish(*s, *reason));
    ready_.back().new_tokens = {handoff.first_token};
    return;
  }
  running_.push_back(std::move(s));
}

bool Engine::ensure_blocks(Sequence& s, int64_t positions) {
  const int64_t bs = pool_.layout().block_size;
  const int64_t need = (positions + bs - 1) / bs - static_cast<int64_t>(s.blocks.size());
  if (need <= 0) return true;
  auto got = pool_.allocate(need);
  if (!got) return false;
  s.blocks.insert(s.blocks.end(), got->begin(), got->end());
  return true;
}

void Engine::drop_blocks(Sequence& s) {
  pool_.release(s.blocks);
  s.blocks.clear();
  s.pooled.clear();  // an embedding's pooling starts again with its recomputation
  s.computed = 0;
  s.published = 0;
  s.received = 0;  // recomputed here from now on
  s.last_hash = kv::kRootHash;
}

void Engine::preempt(Sequence& s) {
  drop_blocks(s);
  ++s.preemptions;
  ++stats_.preemptions;
}

// A new (or preempted) sequence starts from the longest cached prefix of its
// tokens. At least one token is left to compute: its logits are needed.
void Engine::take_cached_prefix(Sequence& s) {
  if (!options_.prefix_caching || s.req.params.prompt_logprobs >= 0 || s.computed > 0 || !s.blocks.empty() ||
      !cached_prefix_usable(s))
    return;
  const int64_t bs = pool_.layout().block_size;
  auto hashes = kv::full_block_hashes(s.tokens, bs);
  if (!hashes.empty() && static_cast<int64_t>(hashes.size()) * bs >= static_cast<int64_t>(s.tokens.size()))
    hashes.pop_back();
  s.cached_from = {};
  s.blocks = pool_.lookup(hashes, &s.cached_from);
  s.computed = static_cast<int64_t>(s.blocks.size()) * bs;
  s.published = static_cast<int64_t>(s.blocks.size());
  s.last_hash = s.blocks.empty() ? kv::kRootHash : hashes[s.blocks.size() - 1];
}

bool Engine::cached_prefix_usable(const Sequence& s) {
  return s.req.pooling != Pooling::kMean && s.req.pooling != Pooling::kCls;
}

// Blocks that filled up in this step become findable by their chained hash.
void Engine::publish_full_blocks(Sequence& s) {
  if (!options_.prefix_caching) return;
  const int64_t bs = pool_.layout().block_size;
  while ((s.published + 1) * bs <= s.computed && s.published < static_cast<int64_t>(s.blocks.size())) {
    const std::span<const int32_t> block(s.tokens.data() + s.published * bs, static_cast<std::size_t>(bs));
    s.last_hash = kv::block_hash(s.last_hash, block);
    pool_.publish(s.blocks[static_cast<std::size_t>(s.published)], s.last_hash, s.published >= s.received);
    ++s.published;
  }
}

// After a token was appended: why the sequence ends now, if it does.
std::optional<FinishReason> Engine::end_reason(Sequence& s) {
  if (finish_check(s)) return FinishReason::kStop;
  if (s.generated() >= s.req.params.max_tokens || static_cast<int64_t>(s.tokens.size()) >= max_model_len_)
    return FinishReason::kLength;
  return std::nullopt;
}

EngineOutput Engine::finish(Sequence& s, FinishReason reason) {
  EngineOutput o;
  if (reason == FinishReason::kPrefilled) o.kv_blocks = std::move(s.blocks);
  else pool_.release(s.blocks);
  s.blocks.clear();
  o.id = s.req.id;
  o.finished = true;
  o.reason = reason;
  o.tokens.assign(s.output().begin(), s.output().end());
  if (s.decoder && !s.stop_string_hit) s.text += s.decoder->finish();
  o.text = std::move(s.text);
  o.logprobs = std::move(s.logprobs);
  o.prompt_logprobs = std::move(s.prompt_logprobs);
  o.prompt_tokens = s.n_prompt;
  o.prompt_tokens_computed = s.prompt_computed;
  const auto now = Clock::now();
  o.ttft_s = s.has_first ? std::chrono::duration<double>(s.first_token - s.added).count() : 0.0;
  o.e2e_s = std::chrono::duration<double>(now - s.added).count();
  o.preemptions = s.preemptions;
  return o;
}

// After a token was appended: true when a stop string, stop token or EOS ends the sequence.
// Before min_tokens tokens are out, nothing does (the sampler bans the stop tokens meanwhile).
bool Engine::finish_check(Sequence& s) {
  const int32_t t = s.tokens.back();
  const auto& p = s.req.params;
  const bool may_stop = s.generated() >= p.min_tokens;
  if (s.decoder && !s.stop_string_hit) {
    const std::size_t before = s.text.size();
    s.text += s.decoder->push(t);
    if (s.text_grammar) {  // where the text so far would be complete
      for (std::size_t k = before; k < s.text.size(); ++k) {
        const bool ok = s.text_ends.back() >= 0 && s.text_grammar->accept(std::string_view(&s.text[k], 1));
        s.text_ends.push_back(ok ? static_cast<char>(s.text_grammar->can_end()) : -1);  // -1: off the grammar
      }
    }
    if (!may_stop) s.stop_text_from = s.text.size();
    for (std::size_t k = 0; k < p.stop.size(); ++k) {
      const std::string& stop = p.stop[k];
      if (stop.empty() || !may_stop) continue;
      // A stop string counts only where it ends in text of the tokens after min_tokens.
      std::size_t from = s.stop_text_from >= stop.size() ? s.stop_text_from - stop.size() + 1 : 0;
      if (s.text_grammar) from = std::max(from, s.stop_from[k]);
      for (auto at = s.text.find(stop, from); at != std::string::npos; at = s.text.find(stop, at + 1)) {
        if (s.text_grammar && s.text_ends[at] != 1) {  // the text before it is not complete: not an end
          s.stop_from[k] = at + 1;
          continue;
        }
        s.text.resize(at);
        s.stop_string_hit = true;
        return true;
      }
    }
  }
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end()) return true;
  if (!p.ignore_eos && std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), t) !=
                           config_.eos_token_ids.end())
    return true;
  return false;
}

std::vector<EngineOutput> Engine::step() {
  std::vector<EngineOutput> outputs = std::move(ready_);
  ready_.clear();
  take_aborts(outputs);
  const std::vector<Planned> plan = schedule();
  if (plan.empty()) return outputs;
  const std::vector<SeqChunk> chunks = chunks_of(plan);
  const bool tokens_on_device = run_model(plan, chunks);
  std::vector<int32_t> drawn(plan.size(), 0);
  std::vector<PositionLogprobs> drawn_logprobs(plan.size());
  if (!tokens_on_device) draw(plan, chunks, drawn, drawn_logprobs);
  emit(plan, chunks, tokens_on_device, drawn, drawn_logprobs, outputs);
  return outputs;
}

// Aborts first: they free blocks for everyone else.
void Engine::take_aborts(std::vector<EngineOutput>& outputs) {
  for (uint64_t id : aborted_) {
    auto match = [id](const std::unique_ptr<Sequence>& s) { return s->req.id == id; };
    if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
      outputs.push_back(finish(**it, FinishReason::kAbort));
      running_.erase(it);
    } else if (auto wt = std::find_if(waiting_.begin(), waiting_.end(), match); wt != waiting_.end()) {
      outputs.push_back(finish(**wt, FinishReason::kAbort));
      waiting_.erase(wt);
    }
  }
  aborted_.clear();

}

// What this step runs: running sequences first (oldest first; out of blocks,
// the youngest is preempted), then waiting ones admitted in order while the
// token budget, the sequence limit and the blocks allow.
std::vector<Engine::Planned> Engine::schedule() {
  std::vector<Planned> plan;
  int64_t budget = options_.max_batched_tokens;

  // Full prompt blocks this step's chunks complete: a waiting sequence whose
  // next block is among them waits a step and then takes it from the cache,
  // so a prefix shared by requests arriving together is computed once.
  std::unordered_set<uint64_t> computing;
  const int64_t bs = pool_.layout().block_size;
  auto note_computing = [&](const Sequence& s, int64_t take) {
    if (!options_.prefix_caching) return;
    uint64_t h = s.last_hash;
    for (int64_t b = s.published; (b + 1) * bs <= std::min(s.computed + take, s.n_prompt); ++b) {
      h = kv::block_hash(h, std::span<const int32_t>(s.tokens.data() + b * bs, static_cast<std::size_t>(bs)));
      computing.insert(h);
    }
  };
  auto next_block_computing = [&](const Sequence& s) {
    if (computing.empty() || s.req.params.prompt_logprobs >= 0 || !cached_prefix_usable(s) ||
        (s.published + 1) * bs >= static_cast<int64_t>(s.tokens.size()))
      return false;
    const std::span<const int32_t> next(s.tokens.data() + s.published * bs, static_cast<std::size_t>(bs));
    return computing.count(kv::block_hash(s.last_hash, next)) > 0;
  };

  // 1. Running sequences, oldest first. Out of blocks: preempt the youngest.
  for (auto it = running_.begin(); it != running_.end() && budget > 0;) {
    Sequence& s = **it;
    const int64_t take = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()) - s.computed, budget);
    bool placed = ensure_blocks(s, s.computed + take);
    while (!placed && &s != running_.back().get()) {
      preempt(*running_.back());
      waiting_.push_front(std::move(running_.back()));
      running_.pop_back();
      placed = ensure_blocks(s, s.computed + take);
    }
    if (!placed) {  // it is the youngest itself
      preempt(s);
      waiting_.push_front(std::move(*it));
      it = running_.erase(it);
      continue;
    }
    if (s.computed < s.n_prompt) note_computing(s, take);
    plan.push_back({&s, take});
    budget -= take;
    ++it;
  }
  // 2. Admit waiting sequences in order while budgets and blocks allow.
  for (auto it = waiting_.begin();
       it != waiting_.end() && budget > 0 && static_cast<int64_t>(running_.size()) < options_.max_num_seqs;) {
    Sequence& s = **it;
    take_cached_prefix(s);
    if (next_block_computing(s)) {  // another sequence computes its next block right now
      drop_blocks(s);
      ++it;
      continue;
    }
    const int64_t take = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()) - s.computed, budget);
    if (!ensure_blocks(s, s.computed + take)) {
      drop_blocks(s);  // gives back the cached prefix it took; it looks again next step
      break;
    }
    // Hits count once per request: not again when a preempted sequence (or one whose KV a
    // prefill rank sent, already counted there) finds its own blocks on coming back.
    if (!s.hits_counted && s.computed > 0) {
      stats_.prefix_hit_tokens += std::min(s.computed, s.n_prompt);
      for (std::size_t t = 0; t < s.cached_from.size(); ++t)
        stats_.hit_tokens_by_tier[t] += s.cached_from[t] * pool_.layout().block_size;
    }
    s.hits_counted = true;
    note_computing(s, take);
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
    plan.push_back({&s, take});
    budget -= take;
  }
  return plan;
}

// One chunk per planned sequence (and the step's shape, for the planner's fit).
std::vector<SeqChunk> Engine::chunks_of(const std::vector<Planned>& plan) {
  std::vector<SeqChunk> chunks;
  chunks.reserve(plan.size());
  last_step_ = {};
  for (const auto& [s, take] : plan) {
    SeqChunk c;
    c.start_pos = s->computed;
    c.tokens = std::span<const int32_t>(s->tokens.data() + s->computed, static_cast<std::size_t>(take));
    c.block_table = s->blocks;
    c.logits_last = s->computed + take == static_cast<int64_t>(s->tokens.size());
    c.logits_all = s->req.params.prompt_logprobs >= 0 && s->computed < s->n_prompt;
    if (s->req.pooling != Pooling::kNone) {  // an embedding: hidden states, no logits
      c.hidden_last = s->req.pooling == Pooling::kLast && c.logits_last;
      c.hidden_all = s->req.pooling == Pooling::kMean || (s->req.pooling == Pooling::kCls && s->computed == 0);
      c.logits_last = c.logits_all = false;
    }
    chunks.push_back(c);
    const auto t = static_cast<double>(take), start = static_cast<double>(s->computed);
    if (s->computed < s->n_prompt) {
      last_step_.prefill_tokens += t;
      last_step_.prefill_ctx += t * start + t * (t + 1) / 2;
    } else {
      last_step_.decode_seqs += t;
      last_step_.decode_ctx += t * (start + 1);
    }
    last_step_.logit_rows += c.logits_all ? t : (c.logits_last ? 1 : 0);
    if (s->computed < s->n_prompt) {
      stats_.prefill_tokens += take;
      s->prompt_computed += std::min(take, s->n_prompt - s->computed);
    } else {
      stats_.decode_tokens += take;
    }
  }
  return chunks;
}

// One forward pass over every planned chunk. True when the backend also
// picked the tokens (where the logits are): greedy or plain-temperature rows.
bool Engine::run_model(const std::vector<Planned>& plan, const std::vector<SeqChunk>& chunks) {
  // Rows a backend may finish where the logits are, instead of sending every
  // row back: no penalties or logprobs, and greedy (forward_argmax) or plain
  // temperature with min-p at most (forward_draw).
  auto plain = [](const SamplingParams& p) {
    return p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
           p.logprobs < 0 && p.prompt_logprobs < 0 && p.logit_bias.empty() && p.min_tokens == 0 && p.grammar.empty();
  };
  auto plain_greedy = [&](const SamplingParams& p) { return plain(p) && p.temperature <= 1e-5f; };
  auto device_drawable = [&](const SamplingParams& p) {
    return plain(p) && (p.temperature <= 1e-5f || (p.top_p >= 1.0f && (p.top_k <= 0 || p.top_k >= config_.vocab)));
  };
  const bool hidden = std::any_of(chunks.begin(), chunks.end(), [](const SeqChunk& c) { return c.hidden_all || c.hidden_last; });
  const bool greedy = std::all_of(plan.begin(), plan.end(), [&](const Planned& pl) { return plain_greedy(pl.seq->req.params); });
  bool tokens_on_device = !hidden && greedy && model_->forward_argmax(chunks, argmax_);
  if (!tokens_on_device && !hidden &&
      std::all_of(plan.begin(), plan.end(), [&](const Planned& pl) { return device_drawable(pl.seq->req.params); })) {
    std::vector<DeviceDraw> draws;
    for (std::size_t i = 0; i < plan.size(); ++i) {
      if (!chunks[i].logits_last) continue;
      const Sequence& s = *plan[i].seq;
      const SamplingParams& p = s.req.params;
      draws.push_back({p.temperature <= 1e-5f ? 0.0f : p.temperature, p.min_p,
                       counter_uniform(s.req.rng_key, static_cast<uint64_t>(s.generated()))});
    }
    tokens_on_device = model_->forward_draw(chunks, draws, argmax_);
  }
  if (!tokens_on_device) model_->forward(chunks, logits_);
  if (hidden && !model_->hidden_rows(hidden_))
    throw Error("embeddings need hidden states, which the " + std::string(model_->name()) + " backend does not give");
  ++stats_.steps;
  return tokens_on_device;
}

// The rows' draws, in parallel (each reads and changes only its own logits
// row, and keys its randomness by its own request): a draw over a 150k
// vocabulary is most of a millisecond, and a step may have hundreds.
void Engine::draw(const std::vector<Planned>& plan, const std::vector<SeqChunk>& chunks, std::vector<int32_t>& drawn,
                  std::vector<PositionLogprobs>& drawn_logprobs) {
  const auto vocab = static_cast<std::size_t>(config_.vocab);
  std::vector<std::pair<std::size_t, std::size_t>> rows;  // (plan index, logits row)
  std::size_t r = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const SeqChunk& c = chunks[i];
    if (c.logits_all) r += c.tokens.size() - (c.logits_last ? 1 : 0);
    if (c.logits_last) rows.emplace_back(i, r++);
  }
  auto one = [&](int64_t k) {
    const auto [i, at] = rows[static_cast<std::size_t>(k)];
    const Sequence& s = *plan[i].seq;
    std::span<float> lg(logits_.data() + at * vocab, vocab);
    std::vector<float> raw;
    if (s.req.params.logprobs >= 0) raw.assign(lg.begin(), lg.end());
    if (has_logit_rules(s.req.params, s.generated())) apply_logit_rules(lg, s.req.params, s.generated(), config_.eos_token_ids);
    if (s.matcher) apply_grammar(s, lg);
    drawn[i] = sample_token(lg, s.req.params, s.prompt(), s.output(), s.req.rng_key, static_cast<uint64_t>(s.generated()));
    if (s.req.params.logprobs >= 0) drawn_logprobs[i] = logprobs_of(raw, drawn[i], s.req.params.logprobs);
  };
  if (options_.sampling_threads && rows.size() > 1) options_.sampling_threads->run(static_cast<int64_t>(rows.size()), one);
  else
    for (std::size_t k = 0; k < rows.size(); ++k) one(static_cast<int64_t>(k));
}

// The step's tokens appended, prompt logprobs kept, blocks published, and
// each sequence's end checked and reported.
void Engine::emit(const std::vector<Planned>& plan, const std::vector<SeqChunk>& chunks, bool tokens_on_device,
                  std::vector<int32_t>& drawn, std::vector<PositionLogprobs>& drawn_logprobs,
                  std::vector<EngineOutput>& outputs) {
  const auto vocab = static_cast<std::size_t>(config_.vocab);
  const auto H = static_cast<std::size_t>(config_.hidden);
  std::size_t row = 0, hidden_row = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    Sequence& s = *plan[i].seq;
    const SeqChunk& c = chunks[i];
    if (s.req.pooling != Pooling::kNone) {  // an embedding: pool this chunk's rows; done at the prompt's end
      const std::size_t n = c.hidden_all ? c.tokens.size() : c.hidden_last ? 1 : 0;
      const float* rows = hidden_.data() + hidden_row * H;
      hidden_row += n;
      if (s.req.pooling == Pooling::kMean) {
        if (s.pooled.empty()) s.pooled.assign(H, 0.0f);
        for (std::size_t t = 0; t < n; ++t)
          for (std::size_t j = 0; j < H; ++j) s.pooled[j] += rows[t * H + j];
      } else if (n > 0) {
        s.pooled.assign(rows, rows + H);  // the first (CLS) or last token's
      }
      s.computed += plan[i].take;
      publish_full_blocks(s);
      if (s.computed < s.n_prompt) continue;
      if (s.req.pooling == Pooling::kMean)
        for (float& v : s.pooled) v /= static_cast<float>(s.n_prompt);
      if (!s.has_first) {
        s.has_first = true;
        s.first_token = Clock::now();
      }
      outputs.push_back(finish(s, FinishReason::kStop));
      outputs.back().embedding = std::move(s.pooled);
      s.done = true;
      continue;
    }
    if (c.logits_all) {
      // Row t predicts position start_pos + t + 1.
      for (std::size_t t = 0; t < c.tokens.size(); ++t) {
        const int64_t target = c.start_pos + static_cast<int64_t>(t) + 1;
        if (target < s.n_prompt) {
          std::span<const float> lg(logits_.data() + (row + t) * vocab, vocab);
          s.prompt_logprobs[static_cast<std::size_t>(target - 1)] =
              logprobs_of(lg, s.tokens[static_cast<std::size_t>(target)], s.req.params.prompt_logprobs);
        }
      }
      row += c.tokens.size() - (c.logits_last ? 1 : 0);
    }
    s.computed += plan[i].take;
    publish_full_blocks(s);
    if (!c.logits_last) continue;
    int32_t tok = 0;
    if (tokens_on_device) {
      tok = argmax_[row++];
    } else {
      ++row;
      tok = drawn[i];
      if (s.req.params.logprobs >= 0) s.logprobs.push_back(std::move(drawn_logprobs[i]));
    }
    s.tokens.push_back(tok);
    follow_grammar(s, tok);
    if (!s.has_first) {
      s.has_first = true;
      s.first_token = Clock::now();
    }
    EngineOutput o;
    o.id = s.req.id;
    o.new_tokens = {tok};
    if (s.req.prefill_only) {  // disaggregated: the decode rank takes it from here
      outputs.push_back(finish(s, FinishReason::kPrefilled));
      outputs.back().new_tokens = {tok};
      s.done = true;
      continue;
    }
    if (const auto reason = end_reason(s)) {
      EngineOutput done = finish(s, *reason);
      done.new_tokens = {tok};
      outputs.push_back(std::move(done));
      s.done = true;
    } else {
      outputs.push_back(std::move(o));
    }
  }
  running_.remove_if([](const std::unique_ptr<Sequence>& s) { return s->done; });
}

}  // namespace tandem::runtime
