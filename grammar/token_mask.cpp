#include "grammar/token_mask.h"

#include <algorithm>
#include <climits>
#include <numeric>

namespace tandem::grammar {

Vocabulary::Vocabulary(std::vector<std::string> spelled, std::vector<int32_t> end_ids,
                       const std::vector<int32_t>& specials)
    : bytes_(std::move(spelled)), ends_(std::move(end_ids)) {
  for (auto& b : bytes_) {
    if (b.find('\xFF') != std::string::npos) b.clear();  // no grammar reads 0xFF but in a special token's spelling
  }
  for (const int32_t id : specials) {
    if (id >= 0 && id < size()) bytes_[static_cast<std::size_t>(id)] = special_token_spelling(id);
  }
  std::sort(ends_.begin(), ends_.end());
  ends_.erase(std::unique(ends_.begin(), ends_.end()), ends_.end());
  for (int32_t id = 0; id < size(); ++id) {
    if (!bytes_[static_cast<std::size_t>(id)].empty() && !is_end(id)) sorted_.push_back(id);
  }
  std::stable_sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return bytes(a) < bytes(b); });
  offsets_.reserve(sorted_.size() + 1);
  for (const int32_t id : sorted_) {
    offsets_.push_back(static_cast<uint32_t>(packed_.size()));
    packed_ += bytes(id);
  }
  offsets_.push_back(static_cast<uint32_t>(packed_.size()));
  lcp_.assign(sorted_.size(), 0);
  for (std::size_t i = 1; i < sorted_.size(); ++i) {
    const std::string& a = bytes(sorted_[i - 1]);
    const std::string& b = bytes(sorted_[i]);
    const std::size_t n = std::min(a.size(), b.size());
    std::size_t k = 0;
    while (k < n && a[k] == b[k]) ++k;
    lcp_[i] = static_cast<uint32_t>(k);
  }
}

bool Vocabulary::is_end(int32_t id) const { return std::binary_search(ends_.begin(), ends_.end(), id); }

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> v)
    : grammar_(std::move(g)), vocab_(std::move(v)) {}

const CompiledGrammar::NodeTokens& CompiledGrammar::node_tokens(int32_t node) const {
  Slot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& s = cache_[node];
    if (!s) s = std::make_unique<Slot>();
    slot = s.get();
  }
  std::call_once(slot->once, [&] { slot->tokens = std::make_unique<NodeTokens>(compute(node)); });
  return *slot->tokens;
}

std::size_t CompiledGrammar::nodes_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.size();
}

CompiledGrammar::NodeTokens CompiledGrammar::compute(int32_t node) const {
  enum class Verdict { kAccepted, kRejected, kUncertain };
  NodeTokens out;
  out.accepted.assign(vocab_->mask_words(), 0);
  StackPool pool;
  Stepper stepper(*grammar_, pool);
  // states[d]: after the first d bytes of the current token. A pop at depth 0
  // is not this node's business: the real state holds the caller's frame as a
  // top of its own, whose sets cover tokens read from there.
  std::vector<State> states(1);  // [d]: storage reused from token to token
  states[0] = stepper.at(pool.intern(node, StackPool::kUnknown));
  std::size_t depth = 0;                // states[0..depth] are the current token's
  std::vector<char> popped(1, 0);       // [d]: the frame could end somewhere in bytes 1..d
  const auto& ids = vocab_->sorted();
  const auto& lcp = vocab_->lcp();
  std::size_t dead_at = SIZE_MAX;  // the previous token's bytes [0, dead_at] left no top
  Verdict dead_longer = Verdict::kRejected, prev = Verdict::kRejected;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string_view t = vocab_->sorted_bytes(i);
    const std::size_t common = i ? lcp[i] : 0;
    Verdict v = Verdict::kAccepted;
    if (i && common == t.size() && common == vocab_->sorted_bytes(i - 1).size()) {
      v = prev;  // the same bytes as the previous id
    } else if (dead_at < common) {
      v = dead_longer;  // shares the prefix that left no top
    } else {
      dead_at = SIZE_MAX;
      depth = std::min(common, depth);
      for (std::size_t d = depth; d < t.size(); ++d) {
        if (states.size() < d + 2) {
          states.resize(d + 2);
          popped.resize(d + 2);
        }
        State& next = states[d + 1];
        stepper.step_into(states[d], static_cast<uint8_t>(t[d]), next);
        const bool ended = popped[d] || next.popped_unknown;
        if (next.tops.empty()) {
          v = (d + 1 == t.size() && next.popped_unknown) ? Verdict::kAccepted
              : ended                                    ? Verdict::kUncertain
                                                         : Verdict::kRejected;
          dead_at = d;
          dead_longer = ended ? Verdict::kUncertain : Verdict::kRejected;
          break;
        }
        popped[d + 1] = ended;
        depth = d + 1;
      }
    }
    prev = v;
    const int32_t id = ids[i];
    if (v == Verdict::kAccepted) out.accepted[static_cast<std::size_t>(id) / 64] |= uint64_t{1} << (id % 64);
    if (v == Verdict::kUncertain) out.uncertain.push_back(id);
  }
  std::sort(out.uncertain.begin(), out.uncertain.end());
  return out;
}

TokenMatcher::TokenMatcher(std::shared_ptr<const CompiledGrammar> g)
    : g_(std::move(g)), matcher_(g_->grammar_ptr()) {}

void TokenMatcher::fill_mask(std::vector<uint64_t>& mask) {
  std::fill(mask.begin(), mask.end(), 0);
  if (ended_) return;
  const State& s = matcher_.state();
  const Vocabulary& vocab = g_->vocabulary();
  StackPool& pool = matcher_.pool();
  Stepper stepper(g_->grammar(), pool);
  const auto set = [&](int32_t id) { mask[static_cast<std::size_t>(id) / 64] |= uint64_t{1} << (id % 64); };
  const auto has = [&](int32_t id) { return (mask[static_cast<std::size_t>(id) / 64] >> (id % 64)) & 1; };
  std::vector<const CompiledGrammar::NodeTokens*> sets;
  sets.reserve(s.tops.size());
  for (const int32_t f : s.tops) {
    sets.push_back(&g_->node_tokens(pool[f].node));
    const auto& acc = sets.back()->accepted;
    for (std::size_t w = 0; w < mask.size(); ++w) mask[w] |= acc[w];
  }
  const std::size_t mark = pool.size();
  for (std::size_t k = 0; k < s.tops.size(); ++k) {
    for (const int32_t id : sets[k]->uncertain) {
      if (has(id)) continue;
      State st;
      st.tops = {s.tops[k]};
      for (const char c : vocab.bytes(id)) {
        st = stepper.step(st, static_cast<uint8_t>(c));
        if (!st.alive()) break;
      }
      if (st.alive()) set(id);
    }
  }
  pool.truncate(mark);
  if (matcher_.can_end()) {
    for (const int32_t id : vocab.ends()) set(id);
  }
}

bool TokenMatcher::accept_token(int32_t id) {
  if (ended_ || id < 0 || id >= g_->vocabulary().size()) return false;
  if (g_->vocabulary().is_end(id)) {
    if (!matcher_.can_end()) return false;
    ended_ = true;
    accepted_end_.push_back(true);
    return true;
  }
  const std::string& b = g_->vocabulary().bytes(id);
  if (b.empty() || !matcher_.accept(b)) return false;
  accepted_end_.push_back(false);
  return true;
}

void TokenMatcher::rollback(std::size_t n) {
  n = std::min(n, accepted_end_.size());
  for (std::size_t k = 0; k < n; ++k) {
    if (accepted_end_.back()) {
      ended_ = false;
    } else {
      matcher_.rollback(1);
    }
    accepted_end_.pop_back();
  }
}

}  // namespace tandem::grammar
