#include "grammar/text_without.h"

#include "common/error.h"
#include "grammar/regex.h"

namespace tandem::grammar {

// With m = m0 m1 ... m(n-1) and m0 nowhere else in m, a scan for m is in
// state j after reading m0..m(j-1); from there m_j moves on to j+1, m0 back
// to 1, anything else to 0. A text avoids m when no scan reaches n:
//
//   text  ::= ( [^m0] | run fail )* ( run part )?
//   run   ::= m0 ( part m0 )*          # ends in state 1
//   part  ::= "" | m1 | m1 m2 | ... | m1..m(n-2)        # states 1..n-1
//   fail  ::= [^m0 m1] | m1 [^m0 m2] | ... | m1..m(n-2) [^m0 m(n-1)]   # back to 0
std::string ebnf_text_without(std::string_view m) {
  if (m.size() < 2) throw Error("a marker to avoid needs two bytes or more, got '" + std::string(m) + "'");
  for (const char c : m) {
    if (static_cast<unsigned char>(c) >= 0x80) throw Error("a marker to avoid must be ASCII: '" + std::string(m) + "'");
  }
  if (m.find(m[0], 1) != std::string_view::npos) {
    throw Error("a marker to avoid may not repeat its first byte: '" + std::string(m) + "'");
  }
  const std::string m0 = ebnf_literal(m.substr(0, 1));
  std::string part = "(\"\"", fail = "(";
  for (std::size_t j = 1; j < m.size(); ++j) {
    const std::string before = j > 1 ? ebnf_literal(m.substr(1, j - 1)) + " " : "";
    if (j + 1 < m.size()) part += " | " + ebnf_literal(m.substr(1, j));
    fail += (j > 1 ? " | " : "") + before + "[^" + ebnf_code_point(static_cast<unsigned char>(m[0])) +
            ebnf_code_point(static_cast<unsigned char>(m[j])) + "]";
  }
  part += ")";
  fail += ")";
  const std::string run = "(" + m0 + " (" + part + " " + m0 + ")*)";
  return "(([^" + ebnf_code_point(static_cast<unsigned char>(m[0])) + "] | " + run + " " + fail + ")* (" + run + " " +
         part + ")?)";
}

// The text stops inside the prefix, or leaves it at some byte, then anything.
std::string ebnf_text_not_starting_with(std::string_view p) {
  if (p.empty()) throw Error("a prefix to avoid must not be empty");
  for (const char c : p) {
    if (static_cast<unsigned char>(c) >= 0x80) throw Error("a prefix to avoid must be ASCII: '" + std::string(p) + "'");
  }
  std::string out = "(\"\"";
  for (std::size_t k = 0; k < p.size(); ++k) {
    const std::string before = k > 0 ? ebnf_literal(p.substr(0, k)) + " " : "";
    if (k > 0) out += " | " + ebnf_literal(p.substr(0, k));
    out += " | " + before + "[^" + ebnf_code_point(static_cast<unsigned char>(p[k])) + "] [\\x00-\\U0010FFFF]*";
  }
  return out + ")";
}

}  // namespace tandem::grammar
