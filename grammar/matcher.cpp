#include "grammar/matcher.h"

#include <algorithm>

namespace tandem::grammar {

int32_t StackPool::intern(int32_t node, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) | static_cast<uint32_t>(parent);
  const auto [it, fresh] = index_.emplace(key, static_cast<int32_t>(frames_.size()));
  if (fresh) frames_.push_back({node, parent});
  return it->second;
}

void StackPool::truncate(std::size_t mark) {
  for (std::size_t k = mark; k < frames_.size(); ++k) {
    const Frame& f = frames_[k];
    index_.erase((static_cast<uint64_t>(static_cast<uint32_t>(f.node)) << 32) | static_cast<uint32_t>(f.parent));
  }
  frames_.resize(std::min(mark, frames_.size()));
}

void Stepper::close(std::vector<int32_t>& work, State& out) {
  seen_.clear();
  const auto& nodes = g_.nodes();
  const auto& edges = g_.edges();
  while (!work.empty()) {
    const int32_t f = work.back();
    work.pop_back();
    if (std::find(seen_.begin(), seen_.end(), f) != seen_.end()) continue;
    seen_.push_back(f);
    const StackPool::Frame fr = pool_[f];
    const Grammar::Node& n = nodes[static_cast<std::size_t>(fr.node)];
    if (n.calls > n.begin) out.tops.push_back(f);
    for (uint32_t k = n.calls; k < n.end; ++k) {
      const Grammar::Edge& e = edges[k];
      const int32_t ret = pool_.intern(e.target, fr.parent);
      work.push_back(pool_.intern(g_.rules()[static_cast<std::size_t>(e.rule)].start, ret));
    }
    if (n.final) {
      if (fr.parent == StackPool::kRoot) {
        out.complete = true;
      } else if (fr.parent == StackPool::kUnknown) {
        out.popped_unknown = true;
      } else {
        work.push_back(fr.parent);
      }
    }
  }
  std::sort(out.tops.begin(), out.tops.end());
}

State Stepper::at(int32_t frame) {
  State out;
  std::vector<int32_t> work{frame};
  close(work, out);
  return out;
}

State Stepper::step(const State& in, uint8_t byte) {
  State out;
  step_into(in, byte, out);
  return out;
}

void Stepper::step_into(const State& in, uint8_t byte, State& out) {
  work_.clear();
  const auto& nodes = g_.nodes();
  const auto& edges = g_.edges();
  for (const int32_t f : in.tops) {
    const StackPool::Frame fr = pool_[f];
    const Grammar::Node& n = nodes[static_cast<std::size_t>(fr.node)];
    for (uint32_t k = n.begin; k < n.calls; ++k) {
      const Grammar::Edge& e = edges[k];
      if (byte >= e.lo && byte <= e.hi) work_.push_back(pool_.intern(e.target, fr.parent));
    }
  }
  out.tops.clear();
  out.complete = out.popped_unknown = false;
  close(work_, out);
}

Matcher::Matcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)), stepper_(*g_, pool_) {
  history_.push_back(stepper_.start());
}

bool Matcher::accept(std::string_view bytes) {
  State s = history_.back();
  for (const char c : bytes) {
    s = stepper_.step(s, static_cast<uint8_t>(c));
    if (!s.alive()) return false;
  }
  history_.push_back(std::move(s));
  return true;
}

void Matcher::rollback(std::size_t n) {
  n = std::min(n, history_.size() - 1);
  history_.resize(history_.size() - n);
}

}  // namespace tandem::grammar
