// The grammar language requests and the JSON-schema converter speak: the
// EBNF of llama.cpp's GBNF and xgrammar (which read the same text):
//
//   root   ::= "{" ws pair ("," ws pair)* "}"    # rules: name ::= expression
//   pair   ::= [a-z]+ ":" value                  # classes: [a-z], [^"\\], \x41, \u00e9
//   value  ::= ("yes" | "no")? digit{1,3}        # ( ) | * + ? {n} {n,} {n,m}
//
// A rule runs until the next `name ::=`; `#` starts a comment. Literals and
// classes take \n \r \t \\ \" \' \] \- \xHH \uHHHH \UHHHHHHHH; a literal is
// UTF-8 bytes, a class matches code points (encoded as UTF-8). `<[ID]>` is
// exactly token ID (llama.cpp's GBNF spelling), the way to let a grammar read
// a special token (Mistral's [TOOL_CALLS]): no other token, nor any run of
// tokens, spells it (special_token_spelling). The root rule is `root`. Refused with one line (what, line:column): anything else,
// including xgrammar's lookahead `(= ...)` and tag dispatch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::grammar {

struct Expr {
  enum class Kind { kEmpty, kLiteral, kClass, kRef, kSeq, kAlt, kRepeat };
  Kind kind = Kind::kEmpty;
  std::string text;                                    // kLiteral: the bytes; kRef: the rule's name
  std::vector<std::pair<uint32_t, uint32_t>> ranges;   // kClass: code points, inclusive
  bool negated = false;                                // kClass: [^...]
  std::vector<Expr> items;                             // kSeq, kAlt; kRepeat: exactly one
  int min = 0, max = -1;                               // kRepeat: max -1 = unbounded

  static Expr literal(std::string bytes);
  static Expr ref(std::string name);
  static Expr seq(std::vector<Expr> items);
  static Expr alt(std::vector<Expr> items);
  static Expr repeat(Expr item, int min, int max);
};

struct RuleDef {
  std::string name;
  Expr body;
};

// Throws tandem::Error "grammar line L, column C: what; how to fix".
std::vector<RuleDef> parse_ebnf(std::string_view text);

// The bytes that stand for special token `id` in a grammar and a vocabulary:
// 0xFF (never in UTF-8, so no literal or class reads it and a Vocabulary
// drops every ordinary token that holds it), then the id's four bytes.
std::string special_token_spelling(int32_t id);

// The longest repetition count {n,m} accepted (a larger one is refused, not
// clipped): each count copies its item in the compiled automaton.
inline constexpr int kMaxRepeat = 4096;

}  // namespace tandem::grammar
