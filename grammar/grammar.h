// A compiled grammar: one byte automaton per rule, whose edges read a byte
// range or call another rule (a pushdown automaton, as xgrammar's). No
// epsilon edges are left: each node lists what it can read or call next and
// whether its rule may end there. Immutable once built; share it freely
// across threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/ebnf.h"

namespace tandem::grammar {

struct GrammarLimits {
  std::size_t max_nodes = 2'000'000;  // automaton nodes over all rules (~40 bytes each)
};

class Grammar {
 public:
  struct Edge {
    int32_t target;   // node reached
    int32_t rule;     // >= 0: call this rule, then continue at target; -1: read a byte in [lo, hi]
    uint8_t lo, hi;
  };
  struct Node {
    int32_t rule;     // the rule it belongs to
    uint32_t begin, end;  // its edges: edges()[begin, end), byte edges first
    uint32_t calls;       // edges()[calls, end) are the calls
    bool final;           // the rule may end here
  };
  struct Rule {
    std::string name;
    int32_t start;
  };

  // Throws tandem::Error naming the rule: an undefined or unused-but-broken
  // reference, left recursion (the matcher could not expand it), a grammar
  // over the limits.
  static std::shared_ptr<const Grammar> compile(const std::vector<RuleDef>& rules, std::string_view root = "root",
                                                const GrammarLimits& limits = {});
  static std::shared_ptr<const Grammar> from_ebnf(std::string_view text, const GrammarLimits& limits = {});

  const std::vector<Rule>& rules() const { return rules_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  int32_t root() const { return root_; }

 private:
  std::vector<Rule> rules_;
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  int32_t root_ = 0;
};

}  // namespace tandem::grammar
