// Running a compiled grammar over bytes: the pushdown automaton's stacks,
// hash-consed into a pool (xgrammar's persistent stack: a frame is its node
// and its parent frame, so stacks that share a bottom share its frames), and
// a state = the stack tops that can read a byte next.
//
// Not thread-safe: one pool (and the states made from it) per thread of use.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace tandem::grammar {

class StackPool {
 public:
  static constexpr int32_t kRoot = -1;     // the parent of the root rule's frame
  static constexpr int32_t kUnknown = -2;  // a parent not known: the token-mask cache's frames

  struct Frame {
    int32_t node;    // a node of the grammar (its rule is nodes()[node].rule)
    int32_t parent;  // the frame to return to, at the node after the call; kRoot or kUnknown
  };

  int32_t intern(int32_t node, int32_t parent);
  const Frame& operator[](int32_t id) const { return frames_[static_cast<std::size_t>(id)]; }
  std::size_t size() const { return frames_.size(); }
  // Forgets every frame interned after size() was `mark` (a trial's frames).
  void truncate(std::size_t mark);

 private:
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> index_;
};

struct State {
  std::vector<int32_t> tops;    // frames whose node has byte edges, sorted
  bool complete = false;        // the root rule may end here
  bool popped_unknown = false;  // a frame with an unknown parent may end here
  bool alive() const { return !tops.empty() || complete || popped_unknown; }
};

class Stepper {
 public:
  Stepper(const Grammar& g, StackPool& pool) : g_(g), pool_(pool) {}

  // The state at the start of `frame` (its calls expanded, its ends popped).
  State at(int32_t frame);
  State start() { return at(pool_.intern(g_.rules()[g_.root()].start, StackPool::kRoot)); }
  // Reads one byte; the result has no tops (and is not alive) when `in` cannot read it.
  State step(const State& in, uint8_t byte);
  // The same into `out` (its storage reused: the token-mask walk's hot loop).
  void step_into(const State& in, uint8_t byte, State& out);

 private:
  void close(std::vector<int32_t>& work, State& out);

  const Grammar& g_;
  StackPool& pool_;
  std::vector<int32_t> seen_;  // scratch of close()
  std::vector<int32_t> work_;  // scratch of step_into()
};

// One sequence's bytes through a grammar, with rollback (what a speculative
// or rejected token needs).
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> g);

  // All of `bytes` or none: false leaves the state as it was.
  bool accept(std::string_view bytes);
  bool can_end() const { return history_.back().complete; }
  // Nothing more can be read: only the end remains.
  bool finished() const { return history_.back().tops.empty(); }
  const State& state() const { return history_.back(); }
  StackPool& pool() { return pool_; }
  const Grammar& grammar() const { return *g_; }
  // Undo the last `n` accept() calls that returned true.
  void rollback(std::size_t n);

 private:
  std::shared_ptr<const Grammar> g_;
  StackPool pool_;
  Stepper stepper_;
  std::vector<State> history_;        // [0] = start; one per accepted call
};

}  // namespace tandem::grammar
