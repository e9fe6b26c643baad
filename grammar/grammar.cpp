#include "grammar/grammar.h"

#include <algorithm>
#include <map>

#include "common/error.h"
#include "grammar/utf8_ranges.h"

namespace tandem::grammar {

namespace {

// One rule's Thompson automaton, epsilon edges included, before they are removed.
struct Nfa {
  struct Edge {
    int32_t target, rule;
    uint8_t lo, hi;
  };
  std::vector<std::vector<Edge>> out;
  std::vector<std::vector<int32_t>> eps;
};

// Which rules are built into their callers' automata instead of called:
// small ones that cannot reach themselves. A string or a number then sits
// inside the object rule that reads it, so a token such as `",` is judged
// inside one rule, without the caller's stack (the token-mask cache's win).
constexpr std::size_t kInlineNodes = 512;

std::vector<char> inlinable_rules(const std::vector<RuleDef>& defs, const std::map<std::string, int32_t>& index,
                                  int32_t root) {
  const std::size_t R = defs.size();
  std::vector<std::vector<int32_t>> refs(R);
  const auto collect = [&](auto&& self, const Expr& e, std::vector<int32_t>& out) -> void {
    if (e.kind == Expr::Kind::kRef) {
      if (const auto it = index.find(e.text); it != index.end()) out.push_back(it->second);
    }
    for (const Expr& item : e.items) self(self, item, out);
  };
  for (std::size_t r = 0; r < R; ++r) collect(collect, defs[r].body, refs[r]);
  std::vector<char> cyclic(R, 0);
  for (std::size_t r = 0; r < R; ++r) {  // does r reach itself?
    std::vector<char> seen(R, 0);
    std::vector<int32_t> stack(refs[r].begin(), refs[r].end());
    while (!stack.empty() && !cyclic[r]) {
      const int32_t q = stack.back();
      stack.pop_back();
      if (q == static_cast<int32_t>(r)) cyclic[r] = 1;
      if (seen[q]) continue;
      seen[q] = 1;
      stack.insert(stack.end(), refs[q].begin(), refs[q].end());
    }
  }
  constexpr std::size_t kCap = std::size_t{1} << 40;
  std::vector<std::size_t> size(R, 0);  // 0 = not yet estimated
  std::vector<char> inl(R, 0);
  const auto estimate = [&](auto&& self, const Expr& e) -> std::size_t {
    std::size_t n = 1;
    switch (e.kind) {
      case Expr::Kind::kEmpty: n = 0; break;
      case Expr::Kind::kLiteral: n = e.text.size(); break;
      case Expr::Kind::kClass: n = 4 + 2 * e.ranges.size(); break;
      case Expr::Kind::kRef: {
        const auto it = index.find(e.text);
        if (it == index.end() || cyclic[it->second] || it->second == root) break;
        const int32_t q = it->second;
        if (size[q] == 0) {
          size[q] = self(self, defs[q].body) + 1;
          inl[q] = size[q] <= kInlineNodes;
        }
        n = inl[q] ? size[q] : 1;
        break;
      }
      case Expr::Kind::kSeq:
      case Expr::Kind::kAlt:
        n = e.items.size() + 1;
        for (const Expr& item : e.items) n = std::min(kCap, n + self(self, item));
        break;
      case Expr::Kind::kRepeat: {
        const std::size_t copies = e.max < 0 ? static_cast<std::size_t>(std::max(e.min, 1)) + 1
                                             : static_cast<std::size_t>(std::max(e.max, 1));
        n = std::min(kCap, self(self, e.items[0]) * copies + 2 * copies);
        break;
      }
    }
    return n;
  };
  for (std::size_t r = 0; r < R; ++r) estimate(estimate, defs[r].body);
  return inl;
}

class RuleBuilder {
 public:
  RuleBuilder(const std::vector<RuleDef>& defs, const std::map<std::string, int32_t>& index,
              const std::vector<char>& inlinable, std::size_t& budget, const std::string& rule)
      : defs_(defs), index_(index), inlinable_(inlinable), budget_(budget), rule_(rule) {}

  Nfa nfa;

  int32_t add() {
    if (budget_ == 0) {
      throw Error("grammar too large: rule '" + rule_ +
                  "' takes the automaton past its node limit; shorten long repetitions {n,m} and big enums, or split the "
                  "schema");
    }
    --budget_;
    nfa.out.emplace_back();
    nfa.eps.emplace_back();
    return static_cast<int32_t>(nfa.out.size() - 1);
  }
  void eps(int32_t a, int32_t b) { nfa.eps[a].push_back(b); }
  void bytes(int32_t a, int32_t b, uint8_t lo, uint8_t hi) { nfa.out[a].push_back({b, -1, lo, hi}); }

  // Builds `e` starting at `from`; returns the node it ends at.
  int32_t build(const Expr& e, int32_t from) {
    switch (e.kind) {
      case Expr::Kind::kEmpty: return from;
      case Expr::Kind::kLiteral: {
        int32_t cur = from;
        for (const char c : e.text) {
          const int32_t n = add();
          const auto b = static_cast<uint8_t>(c);
          bytes(cur, n, b, b);
          cur = n;
        }
        return cur;
      }
      case Expr::Kind::kClass: {
        const int32_t end = add();
        std::vector<std::vector<ByteRange>> seqs;
        for (const auto& [lo, hi] : normalize_ranges(e.ranges, e.negated)) utf8_sequences(lo, hi, seqs);
        if (seqs.empty()) throw Error("grammar rule '" + rule_ + "': a character class matches nothing; remove it");
        for (const auto& seq : seqs) {
          int32_t cur = from;
          for (std::size_t k = 0; k + 1 < seq.size(); ++k) {
            const int32_t n = add();
            bytes(cur, n, seq[k].first, seq[k].second);
            cur = n;
          }
          bytes(cur, end, seq.back().first, seq.back().second);
        }
        return end;
      }
      case Expr::Kind::kRef: {
        const auto it = index_.find(e.text);
        if (it == index_.end()) {
          throw Error("grammar rule '" + rule_ + "' uses rule '" + e.text + "', which is not defined; define `" + e.text +
                      " ::= ...`");
        }
        if (inlinable_[it->second]) return build(defs_[it->second].body, from);
        const int32_t end = add();
        nfa.out[from].push_back({end, it->second, 0, 0});
        return end;
      }
      case Expr::Kind::kSeq: {
        int32_t cur = from;
        for (const Expr& item : e.items) cur = build(item, cur);
        return cur;
      }
      case Expr::Kind::kAlt: {
        const int32_t end = add();
        for (const Expr& item : e.items) {
          const int32_t s = add();  // a fresh start each: no loop of one branch may re-enter another
          eps(from, s);
          eps(build(item, s), end);
        }
        return end;
      }
      case Expr::Kind::kRepeat: {
        const Expr& item = e.items[0];
        int32_t cur = from;
        for (int k = 0; k < e.min; ++k) {
          const int32_t s = add();
          eps(cur, s);
          cur = build(item, s);
        }
        if (e.max < 0) {
          const int32_t loop = add();
          eps(cur, loop);
          eps(build(item, loop), loop);
          return loop;
        }
        const int32_t end = add();
        for (int k = e.min; k < e.max; ++k) {
          eps(cur, end);
          const int32_t s = add();
          eps(cur, s);
          cur = build(item, s);
        }
        eps(cur, end);
        return end;
      }
    }
    return from;
  }

 private:
  const std::vector<RuleDef>& defs_;
  const std::map<std::string, int32_t>& index_;
  const std::vector<char>& inlinable_;
  std::size_t& budget_;
  const std::string& rule_;
};

}  // namespace

std::shared_ptr<const Grammar> Grammar::from_ebnf(std::string_view text, const GrammarLimits& limits) {
  return compile(parse_ebnf(text), "root", limits);
}

std::shared_ptr<const Grammar> Grammar::compile(const std::vector<RuleDef>& defs, std::string_view root,
                                                const GrammarLimits& limits) {
  auto g = std::shared_ptr<Grammar>(new Grammar());
  std::map<std::string, int32_t> index;
  for (const RuleDef& d : defs) {
    if (!index.emplace(d.name, static_cast<int32_t>(index.size())).second) {
      throw Error("grammar rule '" + d.name + "' is defined twice; give each rule one definition");
    }
    g->rules_.push_back({d.name, -1});
  }
  const auto root_it = index.find(std::string(root));
  if (root_it == index.end()) throw Error("the grammar has no rule '" + std::string(root) + "'; define `root ::= ...`");
  g->root_ = root_it->second;

  const std::vector<char> inlinable = inlinable_rules(defs, index, g->root_);
  std::size_t budget = limits.max_nodes;
  for (std::size_t r = 0; r < defs.size(); ++r) {
    RuleBuilder b(defs, index, inlinable, budget, defs[r].name);
    const int32_t start = b.add();
    const int32_t end = b.build(defs[r].body, start);
    const Nfa& nfa = b.nfa;

    // Epsilon closure of every node, then one compiled node per node reached by a real edge.
    std::vector<int32_t> global(nfa.out.size(), -1);
    std::vector<int32_t> work{start};
    global[start] = static_cast<int32_t>(g->nodes_.size());
    g->nodes_.push_back({static_cast<int32_t>(r), 0, 0, 0, false});
    std::vector<uint32_t> seen(nfa.out.size(), 0);  // == gen: in this node's closure
    uint32_t gen = 0;
    while (!work.empty()) {
      const int32_t n = work.back();
      work.pop_back();
      std::vector<int32_t> closure{n}, stack{n};
      seen[n] = ++gen;
      while (!stack.empty()) {
        const int32_t m = stack.back();
        stack.pop_back();
        for (const int32_t t : nfa.eps[m]) {
          if (seen[t] != gen) {
            seen[t] = gen;
            closure.push_back(t);
            stack.push_back(t);
          }
        }
      }
      std::vector<Nfa::Edge> out;
      bool final = false;
      for (const int32_t m : closure) {
        final |= m == end;
        out.insert(out.end(), nfa.out[m].begin(), nfa.out[m].end());
      }
      for (auto& e : out) {
        if (global[e.target] < 0) {
          if (g->nodes_.size() >= limits.max_nodes) {
            throw Error("grammar too large: rule '" + defs[r].name + "' takes the automaton past " +
                        std::to_string(limits.max_nodes) + " nodes; shorten long repetitions and big enums");
          }
          global[e.target] = static_cast<int32_t>(g->nodes_.size());
          g->nodes_.push_back({static_cast<int32_t>(r), 0, 0, 0, false});
          work.push_back(e.target);
        }
        e.target = global[e.target];
      }
      // Byte edges first, merged where they touch on the same target; then the calls.
      std::sort(out.begin(), out.end(), [](const Nfa::Edge& x, const Nfa::Edge& y) {
        if ((x.rule >= 0) != (y.rule >= 0)) return x.rule < 0;
        if (x.target != y.target) return x.target < y.target;
        if (x.rule != y.rule) return x.rule < y.rule;
        return x.lo < y.lo;
      });
      Node& node = g->nodes_[global[n]];
      node.begin = static_cast<uint32_t>(g->edges_.size());
      node.final = final;
      for (const auto& e : out) {
        if (e.rule < 0 && node.begin < g->edges_.size()) {
          Edge& prev = g->edges_.back();
          if (prev.rule < 0 && prev.target == e.target && e.lo <= prev.hi + 1) {
            prev.hi = std::max(prev.hi, e.hi);
            continue;
          }
        }
        if (e.rule >= 0 && node.begin < g->edges_.size()) {
          const Edge& prev = g->edges_.back();
          if (prev.rule == e.rule && prev.target == e.target) continue;
        }
        g->edges_.push_back({e.target, e.rule, e.lo, e.hi});
      }
      node.end = static_cast<uint32_t>(g->edges_.size());
      node.calls = node.end;
      for (uint32_t k = node.begin; k < node.end; ++k) {
        if (g->edges_[k].rule >= 0) {
          node.calls = k;
          break;
        }
      }
    }
    g->rules_[r].start = global[start];
  }

  // Which rules can match nothing at all, then which rule can call which
  // before reading a byte: a cycle there is left recursion.
  const std::size_t R = g->rules_.size();
  std::vector<char> nullable(R, 0);
  const auto reach_without_bytes = [&](int32_t rule, std::vector<int32_t>* called) {
    std::vector<int32_t> stack{g->rules_[rule].start};
    std::vector<int32_t> visited;  // only nodes behind calls of nullable rules: a linear scan is enough
    bool ends = false;
    while (!stack.empty()) {
      const int32_t n = stack.back();
      stack.pop_back();
      if (std::find(visited.begin(), visited.end(), n) != visited.end()) continue;
      visited.push_back(n);
      const Node& node = g->nodes_[n];
      ends |= node.final;
      for (uint32_t k = node.calls; k < node.end; ++k) {
        const Edge& e = g->edges_[k];
        if (called) called->push_back(e.rule);
        if (nullable[e.rule]) stack.push_back(e.target);
      }
    }
    return ends;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < R; ++r) {
      if (!nullable[r] && reach_without_bytes(static_cast<int32_t>(r), nullptr)) nullable[r] = changed = true;
    }
  }
  std::vector<std::vector<int32_t>> left(R);
  for (std::size_t r = 0; r < R; ++r) reach_without_bytes(static_cast<int32_t>(r), &left[r]);
  std::vector<int> color(R, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::string> path;
  const auto visit = [&](auto&& self, int32_t r) -> void {
    color[r] = 1;
    path.push_back(g->rules_[r].name);
    for (const int32_t c : left[r]) {
      if (color[c] == 1) {
        std::string cycle;
        for (auto it = std::find(path.begin(), path.end(), g->rules_[c].name); it != path.end(); ++it) cycle += *it + " -> ";
        throw Error("grammar rule '" + g->rules_[c].name + "' is left-recursive (" + cycle + g->rules_[c].name +
                    "); rewrite it so each rule reads something before calling itself, e.g. `list ::= item (\",\" item)*`");
      }
      if (color[c] == 0) self(self, c);
    }
    path.pop_back();
    color[r] = 2;
  };
  for (std::size_t r = 0; r < R; ++r) {
    if (color[r] == 0) visit(visit, static_cast<int32_t>(r));
  }
  return g;
}

}  // namespace tandem::grammar
