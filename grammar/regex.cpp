#include "grammar/regex.h"

#include <cstdio>
#include <vector>

#include "common/error.h"
#include "grammar/ebnf.h"
#include "grammar/utf8_ranges.h"

namespace tandem::grammar {

std::string ebnf_code_point(uint32_t cp) {
  char buf[16];
  if (cp == '"' || cp == '\\' || cp == ']' || cp == '[' || cp == '-' || cp == '^') return std::string("\\") + static_cast<char>(cp);
  if (cp >= 0x20 && cp < 0x7F) return std::string(1, static_cast<char>(cp));
  if (cp < 0x80) {
    std::snprintf(buf, sizeof buf, "\\x%02X", cp);
  } else if (cp < 0x10000) {
    std::snprintf(buf, sizeof buf, "\\u%04X", cp);
  } else {
    std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  }
  return buf;
}

std::string ebnf_literal(std::string_view bytes) {
  std::string out = "\"";
  for (std::size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    const std::size_t n = utf8_length(c);
    if (c >= 0x80 && n > 1 && i + n <= bytes.size()) {  // UTF-8 passes through as written
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    if (c >= 0x80) throw Error("a literal is not valid UTF-8; the grammar engine reads text as UTF-8");
    out += ebnf_code_point(c);
    ++i;
  }
  return out + "\"";
}

namespace {

using Ranges = std::vector<CodeRange>;

Ranges digit_ranges() { return {{'0', '9'}}; }
Ranges word_ranges() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
Ranges space_ranges() { return {{'\t', '\r'}, {' ', ' '}}; }

class RegexParser {
 public:
  RegexParser(std::string_view p, RegexContext ctx) : p_(p), ctx_(ctx) {}

  std::string parse() {
    if (!at_end() && p_[i_] == '^') ++i_;
    std::string e = alternation(0);
    if (!at_end()) {
      if (p_[i_] == ')') fail("unbalanced ')'", "remove it or open a group");
      fail("unexpected text", "check the pattern");
    }
    return e;
  }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& fix) const {
    throw Error("regex '" + std::string(p_) + "' at offset " + std::to_string(i_) + ": " + what + "; " + fix);
  }
  bool at_end() const { return i_ >= p_.size(); }

  std::string alternation(int depth) {
    if (depth > 100) fail("groups nested more than 100 deep", "flatten the pattern");
    std::vector<std::string> alts{sequence(depth)};
    while (!at_end() && p_[i_] == '|') {
      ++i_;
      alts.push_back(sequence(depth));
    }
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (std::size_t k = 0; k < alts.size(); ++k) out += (k ? " | " : "") + alts[k];
    return out + ")";
  }

  std::string sequence(int depth) {
    std::string out;
    while (!at_end() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$' && i_ + 1 == p_.size()) {  // the end anchor: the match is whole anyway
        ++i_;
        break;
      }
      std::string atom_text = atom(depth);
      atom_text = quantified(std::move(atom_text));
      out += (out.empty() ? "" : " ") + atom_text;
    }
    return out.empty() ? "\"\"" : "(" + out + ")";
  }

  std::string quantified(std::string a) {
    for (;;) {
      if (at_end()) return a;
      const char c = p_[i_];
      std::string q;
      if (c == '*' || c == '+' || c == '?') {
        q = std::string(1, c);
        ++i_;
      } else if (c == '{' && i_ + 1 < p_.size() && p_[i_ + 1] >= '0' && p_[i_ + 1] <= '9') {
        const std::size_t close = p_.find('}', i_);
        if (close == std::string_view::npos) fail("'{' without '}'", "write {n}, {n,} or {n,m}");
        q = std::string(p_.substr(i_, close - i_ + 1));
        int lo = 0, hi = 0;
        char comma = 0;
        const int n = std::sscanf(q.c_str(), "{%d%c%d}", &lo, &comma, &hi);
        if (lo > kMaxRepeat || (n == 3 && hi > kMaxRepeat)) {
          fail("a repetition count above " + std::to_string(kMaxRepeat), "use * or + for long runs");
        }
        if (n == 3 && hi < lo) fail("a repetition {n,m} with m < n", "put the smaller count first");
        i_ = close + 1;
      } else {
        return a;
      }
      if (!at_end() && (p_[i_] == '?' || p_[i_] == '+')) ++i_;  // lazy or possessive: the same language
      a = "(" + a + ")" + q;
    }
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (at_end()) fail("the escape ends early", "write \\xHH or \\uHHHH");
      const char h = p_[i_++];
      const int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
      if (d < 0) fail("not a hex digit", "write \\xHH or \\uHHHH");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  // After a backslash: a set (\d ...) into `set`, or one code point.
  bool escape(Ranges& set, bool& negated, uint32_t& cp) {
    if (at_end()) fail("the pattern ends with a backslash", "escape it as \\\\");
    const char e = p_[i_++];
    negated = false;
    switch (e) {
      case 'd': set = digit_ranges(); return true;
      case 'w': set = word_ranges(); return true;
      case 's': set = space_ranges(); return true;
      case 'D': set = digit_ranges(); negated = true; return true;
      case 'W': set = word_ranges(); negated = true; return true;
      case 'S': set = space_ranges(); negated = true; return true;
      case 'n': cp = '\n'; return false;
      case 'r': cp = '\r'; return false;
      case 't': cp = '\t'; return false;
      case 'f': cp = '\f'; return false;
      case 'v': cp = '\v'; return false;
      case '0': cp = 0; return false;
      case 'x': cp = hex(2); return false;
      case 'u': cp = hex(4); return false;
      case 'b': case 'B': --i_; fail("word boundaries \\b \\B are not supported", "remove them");
      default:
        if (e >= '1' && e <= '9') {
          --i_;
          fail("backreferences are not supported", "repeat the group's pattern instead");
        }
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
          --i_;
          fail(std::string("unknown escape \\") + e, "use \\d \\w \\s \\n \\t \\xHH \\uHHHH or escape punctuation only");
        }
        cp = static_cast<unsigned char>(e);
        return false;
    }
  }

  uint32_t raw_char() {
    const auto c = static_cast<unsigned char>(p_[i_]);
    const std::size_t n = utf8_length(c);
    if (n == 0 || i_ + n > p_.size()) fail("not valid UTF-8", "save the pattern as UTF-8");
    const uint32_t cp = utf8_decode(p_.substr(i_, n));
    i_ += n;
    return cp;
  }

  // The JSON-string context takes out what would need escaping.
  Ranges restrict(Ranges r, bool negated) {
    r = normalize_ranges(std::move(r), negated);
    if (ctx_ != RegexContext::kJsonString) return r;
    Ranges out;
    for (auto [lo, hi] : r) {
      const auto cut = [&](uint32_t a, uint32_t b) {
        if (a <= b) out.emplace_back(a, b);
      };
      lo = std::max<uint32_t>(lo, 0x20);
      if (lo > hi) continue;
      // remove '"' (0x22) and '\' (0x5C)
      uint32_t s = lo;
      for (const uint32_t x : {0x22u, 0x5Cu}) {
        if (x >= s && x <= hi) {
          cut(s, x - 1);
          s = x + 1;
        }
      }
      cut(s, hi);
    }
    return out;
  }

  std::string class_text(const Ranges& r) {
    if (r.empty()) fail("a class that matches no character here", "a JSON string pattern cannot produce '\"', '\\' or control characters");
    std::string out = "[";
    for (const auto& [lo, hi] : r) {
      out += ebnf_code_point(lo);
      if (hi != lo) out += "-" + ebnf_code_point(hi);
    }
    return out + "]";
  }

  std::string char_text(uint32_t cp) {
    if (ctx_ == RegexContext::kJsonString && (cp < 0x20 || cp == '"' || cp == '\\')) {
      fail("a JSON string pattern cannot produce '\"', '\\' or control characters unescaped",
           "drop them from the pattern (the output would need JSON escapes)");
    }
    return "\"" + ebnf_code_point(cp) + "\"";
  }

  std::string bracket() {
    ++i_;  // '['
    bool negated = false;
    if (!at_end() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    Ranges r;
    bool first = true;
    while (!at_end() && (p_[i_] != ']' || first)) {
      first = false;
      uint32_t lo = 0;
      if (p_[i_] == '\\') {
        ++i_;
        Ranges set;
        bool neg = false;
        if (escape(set, neg, lo)) {
          for (const auto& x : normalize_ranges(set, neg)) r.push_back(x);
          continue;
        }
      } else if (p_[i_] == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        fail("POSIX classes [:alpha:] are not supported", "list the ranges, e.g. [a-zA-Z]");
      } else {
        lo = raw_char();
      }
      uint32_t hi = lo;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          ++i_;
          Ranges set;
          bool neg = false;
          if (escape(set, neg, hi)) fail("a range that ends in a class escape", "end the range with a character");
        } else {
          hi = raw_char();
        }
        if (hi < lo) fail("a class range whose end comes before its start", "write the smaller character first");
      }
      r.emplace_back(lo, hi);
    }
    if (at_end()) fail("'[' without ']'", "close the class");
    ++i_;
    return class_text(restrict(r, negated));
  }

  std::string atom(int depth) {
    const char c = p_[i_];
    switch (c) {
      case '(': {
        ++i_;
        if (!at_end() && p_[i_] == '?') {
          if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
            i_ += 2;
          } else if (i_ + 1 < p_.size() && p_[i_ + 1] == '<' && i_ + 2 < p_.size() && p_[i_ + 2] != '=' && p_[i_ + 2] != '!') {
            const std::size_t close = p_.find('>', i_);
            if (close == std::string_view::npos) fail("a named group without '>'", "write (?<name>...)");
            i_ = close + 1;
          } else {
            fail("lookaround and inline flags (?=, (?!, (?<=, (?i) are not supported", "rewrite without them");
          }
        }
        std::string inner = alternation(depth + 1);
        if (at_end() || p_[i_] != ')') fail("'(' without ')'", "close the group");
        ++i_;
        return "(" + inner + ")";
      }
      case '[': return bracket();
      case '.': {
        ++i_;
        return class_text(restrict({{'\n', '\n'}}, true));
      }
      case '\\': {
        ++i_;
        Ranges set;
        bool neg = false;
        uint32_t cp = 0;
        if (escape(set, neg, cp)) return class_text(restrict(set, neg));
        return char_text(cp);
      }
      case '*': case '+': case '?': fail("a quantifier with nothing to repeat", "escape it, e.g. \\*");
      case '^': fail("'^' inside the pattern", "patterns match whole strings: use ^ only at the start");
      case '$': fail("'$' inside the pattern", "use $ only at the end");
      default: return char_text(raw_char());
    }
  }

  std::string_view p_;
  RegexContext ctx_;
  std::size_t i_ = 0;
};

}  // namespace

std::string regex_to_ebnf(std::string_view pattern, RegexContext context) {
  return RegexParser(pattern, context).parse();
}

}  // namespace tandem::grammar
