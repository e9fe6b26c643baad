#include "grammar/ebnf.h"

#include "common/error.h"
#include "grammar/utf8_ranges.h"

namespace tandem::grammar {

std::string special_token_spelling(int32_t id) {
  const auto u = static_cast<uint32_t>(id);
  return std::string{'\xFF', static_cast<char>(u >> 24), static_cast<char>((u >> 16) & 0xFF),
                     static_cast<char>((u >> 8) & 0xFF), static_cast<char>(u & 0xFF)};
}

Expr Expr::literal(std::string bytes) {
  Expr e;
  e.kind = Kind::kLiteral;
  e.text = std::move(bytes);
  return e;
}
Expr Expr::ref(std::string name) {
  Expr e;
  e.kind = Kind::kRef;
  e.text = std::move(name);
  return e;
}
Expr Expr::seq(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  Expr e;
  e.kind = items.empty() ? Kind::kEmpty : Kind::kSeq;
  e.items = std::move(items);
  return e;
}
Expr Expr::alt(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  Expr e;
  e.kind = Kind::kAlt;
  e.items = std::move(items);
  return e;
}
Expr Expr::repeat(Expr item, int min, int max) {
  Expr e;
  e.kind = Kind::kRepeat;
  e.items.push_back(std::move(item));
  e.min = min;
  e.max = max;
  return e;
}

namespace {

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  std::vector<RuleDef> rules() {
    std::vector<RuleDef> out;
    skip_space();
    if (at_end()) fail("the grammar is empty", "define at least `root ::= ...`");
    while (!at_end()) {
      if (!is_name_start(s_[i_])) fail("expected a rule name", "each rule reads `name ::= expression`");
      RuleDef r;
      r.name = name();
      skip_space();
      if (s_.substr(i_, 3) != "::=") fail("expected '::=' after the rule name '" + r.name + "'", "write `" + r.name + " ::= ...`");
      i_ += 3;
      r.body = alternation(0);
      out.push_back(std::move(r));
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& fix) const {
    int line = 1, col = 1;
    for (std::size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw Error("grammar line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what + "; " + fix);
  }

  bool at_end() const { return i_ >= s_.size(); }

  void skip_space() {
    while (!at_end()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (!at_end() && s_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }

  std::string name() {
    const std::size_t b = i_;
    while (!at_end() && is_name_char(s_[i_])) ++i_;
    return std::string(s_.substr(b, i_ - b));
  }

  // At `name ::=`: the next rule starts here.
  bool at_rule_start() {
    if (at_end() || !is_name_start(s_[i_])) return false;
    const std::size_t save = i_;
    name();
    skip_space();
    const bool yes = s_.substr(i_, 3) == "::=";
    i_ = save;
    return yes;
  }

  Expr alternation(int depth) {
    if (depth > 200) fail("parentheses nested more than 200 deep", "flatten the expression into named rules");
    std::vector<Expr> alts;
    alts.push_back(sequence(depth));
    while (!at_end() && s_[i_] == '|') {
      ++i_;
      alts.push_back(sequence(depth));
    }
    return Expr::alt(std::move(alts));
  }

  Expr sequence(int depth) {
    std::vector<Expr> items;
    for (;;) {
      skip_space();
      if (at_end() || s_[i_] == '|' || s_[i_] == ')' || at_rule_start()) break;
      Expr item = primary(depth);
      postfix(item);
      items.push_back(std::move(item));
    }
    return Expr::seq(std::move(items));
  }

  void postfix(Expr& item) {
    for (;;) {
      skip_space();
      if (at_end()) return;
      const char c = s_[i_];
      if (c == '*' || c == '+' || c == '?') {
        ++i_;
        item = Expr::repeat(std::move(item), c == '+' ? 1 : 0, c == '?' ? 1 : -1);
      } else if (c == '{') {
        ++i_;
        const int lo = count();
        int hi = lo;
        skip_space();
        if (!at_end() && s_[i_] == ',') {
          ++i_;
          skip_space();
          hi = (!at_end() && s_[i_] == '}') ? -1 : count();
        }
        skip_space();
        if (at_end() || s_[i_] != '}') fail("expected '}' to close the repetition", "write {n}, {n,} or {n,m}");
        ++i_;
        if (hi != -1 && hi < lo) fail("repetition {" + std::to_string(lo) + "," + std::to_string(hi) + "} has max < min", "put the smaller count first");
        item = Expr::repeat(std::move(item), lo, hi);
      } else {
        return;
      }
    }
  }

  int count() {
    skip_space();
    if (at_end() || s_[i_] < '0' || s_[i_] > '9') fail("expected a number in the repetition", "write {n}, {n,} or {n,m}");
    long v = 0;
    while (!at_end() && s_[i_] >= '0' && s_[i_] <= '9') {
      v = v * 10 + (s_[i_++] - '0');
      if (v > kMaxRepeat) fail("repetition count above " + std::to_string(kMaxRepeat), "use * or + for long runs");
    }
    return static_cast<int>(v);
  }

  Expr primary(int depth) {
    const char c = s_[i_];
    if (c == '"') return literal();
    if (c == '[') return char_class();
    if (c == '<') return token_ref();
    if (c == '(') {
      ++i_;
      skip_space();
      if (!at_end() && s_[i_] == '=') fail("lookahead assertions '(= ...)' are not supported", "remove the assertion");
      Expr inner = alternation(depth + 1);
      skip_space();
      if (at_end() || s_[i_] != ')') fail("expected ')'", "close the group");
      ++i_;
      return inner;
    }
    if (is_name_start(c)) return Expr::ref(name());
    fail(std::string("unexpected character '") + c + "'", "expressions are \"literals\", [classes], (groups) and rule names");
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (at_end()) fail("the escape ends early", "write \\xHH, \\uHHHH or \\UHHHHHHHH");
      const char h = s_[i_++];
      int d = -1;
      if (h >= '0' && h <= '9') d = h - '0';
      if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0) fail(std::string("'") + h + "' is not a hex digit", "write \\xHH, \\uHHHH or \\UHHHHHHHH");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  // One character of a literal or class, decoded to a code point.
  uint32_t character() {
    if (at_end()) fail("the text ends inside a literal or class", "close it");
    unsigned char c = static_cast<unsigned char>(s_[i_]);
    if (c == '\\') {
      ++i_;
      if (at_end()) fail("the text ends inside an escape", "complete it");
      const char e = s_[i_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '0': return 0;
        case '\\': case '"': case '\'': case ']': case '[': case '-': case '^': case '/': return static_cast<unsigned char>(e);
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        default: --i_; fail(std::string("unknown escape '\\") + e + "'", "use \\n \\r \\t \\\\ \\\" \\xHH \\uHHHH");
      }
    }
    const std::size_t len = utf8_length(c);
    if (len == 0 || i_ + len > s_.size()) fail("the grammar is not valid UTF-8 here", "save it as UTF-8");
    const uint32_t cp = utf8_decode(s_.substr(i_, len));
    i_ += len;
    return cp;
  }

  // <[ID]>: exactly the token ID (a special token such as Mistral's [TOOL_CALLS]), as llama.cpp's GBNF writes it.
  Expr token_ref() {
    if (s_.substr(i_, 2) != "<[") fail("expected '<[' to begin a token reference", "write <[ID]> for token ID");
    i_ += 2;
    long id = 0;
    const std::size_t digits = i_;
    while (!at_end() && s_[i_] >= '0' && s_[i_] <= '9') {
      id = id * 10 + (s_[i_++] - '0');
      if (id > INT32_MAX) fail("token id above 2^31-1", "write the token's id");
    }
    if (i_ == digits || s_.substr(i_, 2) != "]>") fail("expected a token id and ']>'", "write <[ID]> for token ID");
    i_ += 2;
    return Expr::literal(special_token_spelling(static_cast<int32_t>(id)));
  }

  Expr literal() {
    ++i_;
    std::string bytes;
    while (!at_end() && s_[i_] != '"') {
      const uint32_t cp = character();
      if (cp > 0x10FFFF) fail("code point above U+10FFFF", "fix the escape");
      bytes += utf8_encode(cp);
    }
    if (at_end()) fail("the literal is not closed", "end it with \"");
    ++i_;
    return bytes.empty() ? Expr{} : Expr::literal(std::move(bytes));
  }

  Expr char_class() {
    ++i_;
    Expr e;
    e.kind = Expr::Kind::kClass;
    if (!at_end() && s_[i_] == '^') {
      e.negated = true;
      ++i_;
    }
    while (!at_end() && s_[i_] != ']') {
      const uint32_t lo = character();
      uint32_t hi = lo;
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        hi = character();
        if (hi < lo) fail("class range with its end before its start", "write the smaller character first");
      }
      if (hi > 0x10FFFF) fail("code point above U+10FFFF", "fix the escape");
      e.ranges.emplace_back(lo, hi);
    }
    if (at_end()) fail("the character class is not closed", "end it with ]");
    ++i_;
    if (e.ranges.empty() && !e.negated) fail("empty character class []", "list at least one character");
    return e;
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

}  // namespace

std::vector<RuleDef> parse_ebnf(std::string_view text) { return Parser(text).rules(); }

}  // namespace tandem::grammar
