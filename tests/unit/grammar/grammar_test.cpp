// The grammar engine: EBNF, regex and JSON schema compiled to one automaton,
// strings accepted or refused as the language says, token masks equal to
// trying every token.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/token_mask.h"
#include "grammar/utf8_ranges.h"

using namespace tandem::grammar;
using tandem::Error;

namespace {

bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.accept(text) && m.can_end();
}
bool accepts(const std::string& ebnf, const std::string& text) { return accepts(Grammar::from_ebnf(ebnf), text); }

std::shared_ptr<const Grammar> schema(const std::string& json) {
  return Grammar::from_ebnf(json_schema_to_ebnf(nlohmann::ordered_json::parse(json)));
}
std::shared_ptr<const Grammar> regex(const std::string& re) {
  return Grammar::from_ebnf("root ::= " + regex_to_ebnf(re, RegexContext::kText));
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("EBNF: sequences, alternatives, repetition and classes", "[grammar]") {
  const std::string g = R"(root ::= "a" b* ("x" | "yz")? c{2,3}
b ::= [0-9]
c ::= [^a-z])";
  CHECK(accepts(g, "aAB"));
  CHECK(accepts(g, "a123xAB"));
  CHECK(accepts(g, "ayzABC"));
  CHECK(accepts(g, "a\xC3\xA9\xE2\x82\xAC"));  // é €: a negated class reads whole UTF-8 characters
  CHECK_FALSE(accepts(g, "aA"));
  CHECK_FALSE(accepts(g, "aABCD"));
  CHECK_FALSE(accepts(g, "ayABC"));
  CHECK_FALSE(accepts(g, "a\xFF\xFF"));  // not UTF-8
  CHECK_FALSE(accepts(g, "a\xC3\xA9"));  // one character where two are needed
  CHECK(accepts("root ::= \"\\u00e9\\x41\\n\"", "\xC3\xA9" "A\n"));
  // multi-line rules and comments
  CHECK(accepts("# a list\nroot ::= item\n  (\",\" item)*  # more\nitem ::= [a-c]+", "ab,c,a"));
}

TEST_CASE("EBNF: recursion to any depth, left recursion refused", "[grammar]") {
  const auto g = Grammar::from_ebnf(R"g(root ::= "(" root ")" | "")g");
  CHECK(accepts(g, ""));
  CHECK(accepts(g, std::string(200, '(') + std::string(200, ')')));
  CHECK_FALSE(accepts(g, "(()"));
  CHECK_THAT(error_of([] { Grammar::from_ebnf("root ::= list\nlist ::= list \",\" \"a\" | \"a\""); }),
             Catch::Contains("'list' is left-recursive"));
  CHECK_THAT(error_of([] { Grammar::from_ebnf("root ::= e? root \"x\"\ne ::= \"\""); }),
             Catch::Contains("left-recursive"));
}

TEST_CASE("EBNF: mistakes are one line with the position", "[grammar]") {
  CHECK_THAT(error_of([] { Grammar::from_ebnf("root ::= item"); }), Catch::Contains("'item', which is not defined"));
  CHECK_THAT(error_of([] { Grammar::from_ebnf("start ::= \"a\""); }), Catch::Contains("no rule 'root'"));
  CHECK_THAT(error_of([] { Grammar::from_ebnf("root ::= \"a\"\n  \"b"); }), Catch::Contains("line 2"));
  CHECK_THAT(error_of([] { Grammar::from_ebnf("root ::= [a-"); }), Catch::Contains("not closed"));
  CHECK_THAT(error_of([] { Grammar::from_ebnf("root ::= \"a\"{5000}"); }), Catch::Contains("above 4096"));
  CHECK_THAT(error_of([] { Grammar::from_ebnf("root ::= (= \"a\") \"a\""); }), Catch::Contains("lookahead"));
  CHECK_THAT(error_of([] { Grammar::from_ebnf("root ::= \"a\"\nroot ::= \"b\""); }), Catch::Contains("defined twice"));
  GrammarLimits small;
  small.max_nodes = 1000;
  CHECK_THAT(error_of([&] { Grammar::from_ebnf("root ::= ([a-z]{100}){100}", small); }), Catch::Contains("too large"));
}

TEST_CASE("UTF-8 ranges spell exactly their code points", "[grammar]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    uint32_t lo = rng() % 0x110000, hi = rng() % 0x110000;
    if (trial % 4 == 0) hi = lo + rng() % 300;
    if (lo > hi) std::swap(lo, hi);
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    const auto ranges = normalize_ranges({{lo, hi}}, trial % 3 == 0);
    std::vector<std::vector<ByteRange>> seqs;
    for (const auto& [a, b] : ranges) utf8_sequences(a, b, seqs);
    const auto inside = [&](uint32_t cp) {
      for (const auto& [a, b] : ranges) if (cp >= a && cp <= b) return true;
      return false;
    };
    int64_t wrong = -1;
    for (uint32_t cp = 0; cp < 0x110000; cp += (trial % 4 == 0 ? 1 : 97)) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const std::string s = utf8_encode(cp);
      int matched = 0;
      for (const auto& seq : seqs) {
        bool ok = seq.size() == s.size();
        for (std::size_t k = 0; ok && k < s.size(); ++k) {
          ok = static_cast<uint8_t>(s[k]) >= seq[k].first && static_cast<uint8_t>(s[k]) <= seq[k].second;
        }
        matched += ok;
      }
      if (matched != (inside(cp) ? 1 : 0) && wrong < 0) wrong = static_cast<int64_t>(cp);
    }
    INFO("first code point spelled wrongly: U+" << std::hex << wrong << " for [" << lo << "," << hi << "]");
    REQUIRE(wrong == -1);
  }
}

TEST_CASE("regex: the supported subset matches whole strings", "[grammar]") {
  CHECK(accepts(regex("^[a-z]+@[a-z]+\\.(com|org)$"), "me@example.org"));
  CHECK_FALSE(accepts(regex("[a-z]+@[a-z]+\\.(com|org)"), "me@example.net"));
  CHECK(accepts(regex("\\d{3}-\\d{4}"), "555-1234"));
  CHECK_FALSE(accepts(regex("\\d{3}-\\d{4}"), "555-12345"));
  CHECK(accepts(regex("(?:ab)+?c*"), "ababcc"));
  CHECK(accepts(regex("[^\\s]{2,}"), "\xE2\x82\xAC!"));
  CHECK_FALSE(accepts(regex("a.b"), "a\nb"));
  CHECK(accepts(regex("a.b"), "a\xC3\xA9" "b"));
  CHECK(accepts(regex("(?<year>\\d{4})"), "2026"));
  CHECK_THAT(error_of([] { regex("(?=a)a"); }), Catch::Contains("lookaround"));
  CHECK_THAT(error_of([] { regex("(a)\\1"); }), Catch::Contains("backreferences"));
  CHECK_THAT(error_of([] { regex("a\\b"); }), Catch::Contains("word boundaries"));
  CHECK_THAT(error_of([] { regex("a(b"); }), Catch::Contains("without ')'"));
  CHECK_THAT(error_of([] { regex("*a"); }), Catch::Contains("nothing to repeat"));
  CHECK_THAT(error_of([] { regex_to_ebnf("a\"b", RegexContext::kJsonString); }), Catch::Contains("JSON string"));
}

TEST_CASE("JSON schema: objects keep the schema's order, optional properties may go", "[grammar]") {
  const auto g = schema(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
    "tags":{"type":"array","items":{"type":"string"}}},"required":["name"]})");
  CHECK(accepts(g, R"({"name":"Ada"})"));
  CHECK(accepts(g, R"({"name":"Ada","age":36})"));
  CHECK(accepts(g, R"({"name":"Ada","tags":["x","y\"z"]})"));
  CHECK(accepts(g, R"({"name":"Ada","age":-1,"tags":[]})"));
  CHECK_FALSE(accepts(g, R"({"age":36,"name":"Ada"})"));  // out of order
  CHECK_FALSE(accepts(g, R"({"age":36})"));               // name is required
  CHECK_FALSE(accepts(g, R"({"name":"Ada","x":1})"));     // no additional properties
  CHECK_FALSE(accepts(g, R"({"name": "Ada"})"));          // compact: no whitespace
  CHECK_FALSE(accepts(g, R"({"name":"Ada",})"));
  const auto all_optional = schema(R"({"properties":{"a":{"type":"null"},"b":{"type":"boolean"}}})");
  for (const char* ok : {"{}", R"({"a":null})", R"({"b":true})", R"({"a":null,"b":false})"}) CHECK(accepts(all_optional, ok));
  CHECK_FALSE(accepts(all_optional, R"({,"b":true})"));
  const auto addl = schema(R"({"properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})");
  CHECK(accepts(addl, R"({"a":1,"x":"y","z":""})"));
  CHECK(accepts(addl, R"({"x":"y"})"));
  CHECK_FALSE(accepts(addl, R"({"a":1,"x":2})"));
}

TEST_CASE("JSON schema: integer bounds are exact", "[grammar]") {
  const auto check_range = [](const std::string& bounds, int lo, int hi) {
    const auto g = schema(R"({"type":"integer",)" + bounds + "}");
    for (int v = -2500; v <= 6000; ++v) {
      INFO(bounds << " value " << v);
      REQUIRE(accepts(g, std::to_string(v)) == (v >= lo && v <= hi));
    }
    CHECK_FALSE(accepts(g, "007"));
  };
  check_range(R"("minimum":-123,"maximum":4567)", -123, 4567);
  check_range(R"("exclusiveMinimum":0,"maximum":999)", 1, 999);
  check_range(R"("minimum":-2000,"exclusiveMaximum":-7)", -2000, -8);
  check_range(R"("minimum":10)", 10, 1 << 30);
  check_range(R"("maximum":-10)", -(1 << 30), -10);
  check_range(R"("minimum":0,"maximum":0)", 0, 0);
}

TEST_CASE("JSON schema: strings, arrays, enums, refs, formats", "[grammar]") {
  CHECK(accepts(schema(R"({"type":"string","minLength":2,"maxLength":3})"), R"("\u00e9x")"));
  CHECK_FALSE(accepts(schema(R"({"type":"string","minLength":2,"maxLength":3})"), R"("abcd")"));
  CHECK(accepts(schema(R"({"type":"string","pattern":"^[A-Z]{2}\\d+$"})"), R"("AB12")"));
  CHECK(accepts(schema(R"({"format":"date-time"})"), R"("2026-12-04T19:30:00.5+01:00")"));
  const auto date = schema(R"({"format":"date"})");
  for (const char* ok : {R"("2026-12-04")", R"("2024-02-29")", R"("2000-02-29")", R"("1999-04-30")", R"("0001-01-31")"}) {
    CHECK(accepts(date, ok));
  }
  for (const char* bad : {R"("2026-13-04")", R"("2023-02-29")", R"("1900-02-29")", R"("2026-04-31")", R"("2026-02-30")",
                          R"("2026-00-10")", R"("2026-01-00")"}) {
    CHECK_FALSE(accepts(date, bad));
  }
  CHECK_FALSE(accepts(schema(R"({"format":"time"})"), R"("12:00:60Z")"));
  CHECK(accepts(schema(R"({"format":"uuid"})"), R"("123e4567-e89b-12d3-a456-426614174000")"));
  CHECK(accepts(schema(R"({"format":"email"})"), R"("a.b@c.example")"));
  const auto arr = schema(R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],
    "items":{"type":"boolean"},"minItems":1,"maxItems":4})");
  CHECK(accepts(arr, "[1]"));
  CHECK(accepts(arr, R"([1,"a",true,false])"));
  CHECK_FALSE(accepts(arr, "[]"));
  CHECK_FALSE(accepts(arr, R"([1,"a",true,false,true])"));
  CHECK_FALSE(accepts(arr, R"([1,2])"));
  const auto e = schema(R"({"enum":["red",2,null,{"k":[1]}]})");
  for (const char* ok : {R"("red")", "2", "null", R"({"k":[1]})"}) CHECK(accepts(e, ok));
  CHECK_FALSE(accepts(e, R"("blue")"));
  const auto tree = schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
    "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})");
  CHECK(accepts(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  CHECK_FALSE(accepts(tree, R"({"v":1,"kids":[{"kids":[]}]})"));
  const auto any_of = schema(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}],"title":"t"})");
  CHECK(accepts(any_of, "5"));
  CHECK(accepts(any_of, R"("x")"));
  CHECK_FALSE(accepts(any_of, R"("xy")"));
  const auto all_of = schema(R"({"allOf":[{"properties":{"a":{"type":"integer"}},"required":["a"]},
    {"properties":{"b":{"type":"integer"}}}]})");
  CHECK(accepts(all_of, R"({"a":1,"b":2})"));
  CHECK_FALSE(accepts(all_of, R"({"b":2})"));
  const auto obj = Grammar::from_ebnf(json_object_ebnf());
  CHECK(accepts(obj, R"({"a":[1,{"b":null}],"c":"\n"})"));
  CHECK_FALSE(accepts(obj, R"([1])"));
}

TEST_CASE("JSON schema: what is not enforced is refused, naming where", "[grammar]") {
  const auto err = [](const std::string& s) { return error_of([&] { schema(s); }); };
  CHECK_THAT(err(R"({"type":"object","properties":{"n":{"type":"number","multipleOf":2}}})"),
             Catch::Contains("at /properties/n: 'multipleOf' is not supported"));
  CHECK_THAT(err(R"({"type":"array","uniqueItems":true})"), Catch::Contains("'uniqueItems'"));
  CHECK_THAT(err(R"({"type":"number","minimum":1})"), Catch::Contains("integers only"));
  CHECK_THAT(err(R"({"$ref":"https://example.com/s.json"})"), Catch::Contains("not local"));
  CHECK_THAT(err(R"({"$ref":"#/$defs/missing"})"), Catch::Contains("points nowhere"));
  CHECK_THAT(err(R"({"format":"hostname"})"), Catch::Contains("format 'hostname'"));
  CHECK_THAT(err(R"({"type":"object","required":["x"]})"), Catch::Contains("'x' is not in 'properties'"));
  CHECK_THAT(err(R"({"type":"integer","minimum":5,"maximum":1})"), Catch::Contains("no integer"));
  CHECK_THAT(err(R"j({"type":"string","pattern":"(?!x)"})j"), Catch::Contains("lookaround"));
  // Pathological inputs end in an error, quickly: repetition that multiplies past the limit, a huge enum.
  CHECK_THAT(error_of([] { regex("((a{100}){100}){100}"); }), Catch::Contains("too large"));
  CHECK_THAT(error_of([] { regex("(a*)*(b+)+" + std::string(3000, 'c') + "{4097}"); }), Catch::Contains("above 4096"));
  nlohmann::json huge = nlohmann::json::array();
  for (int k = 0; k < 200000; ++k) huge.push_back("value number " + std::to_string(k) + " of a very long enumeration");
  CHECK_THAT(err(nlohmann::json({{"enum", huge}}).dump()), Catch::Contains("too large"));
  CHECK(accepts(regex("(a*)*b"), "aaab"));  // nested stars compile to a small automaton, no blow-up
  std::string deep = R"({"type":"string"})";
  for (int k = 0; k < 100; ++k) deep = R"({"type":"array","items":)" + deep + "}";
  CHECK_THAT(err(deep), Catch::Contains("deeper than 64"));
}

namespace {

// A small byte vocabulary: every printable ASCII character, some multi-byte
// tokens that cross JSON boundaries, UTF-8 pieces; id 0 ends.
std::shared_ptr<const Vocabulary> test_vocabulary() {
  std::vector<std::string> v{""};
  for (int c = 0x20; c < 0x7F; ++c) v.emplace_back(1, static_cast<char>(c));
  for (const char* t : {"\"", "\":", "\",\"", "\"}", "}]", "],", "{\"", "true", "tr", "ue", "null", "12", "-1", "0.",
                        "e+", "name", "age", "\":\"", "\"]", "[\"", "\xC3", "\xA9", "\xC3\xA9", "\n", " \"", "\\\"", "\\u00",
                        "Ada", "tags", "\"name\":\"", "},{\"", "\",", "true}", "2}", "7,", "9]", "12}", "0,\""}) {
    v.emplace_back(t);
  }
  v.emplace_back("\"");  // the same bytes under a second id
  return std::make_shared<Vocabulary>(std::move(v), std::vector<int32_t>{0});
}

}  // namespace

TEST_CASE("token masks equal trying every token, on random walks", "[grammar]") {
  const auto vocab = test_vocabulary();
  const std::vector<std::string> grammars{
      json_schema_to_ebnf(nlohmann::ordered_json::parse(R"({"type":"object","properties":{"name":{"type":"string"},
        "age":{"type":"integer","minimum":-5,"maximum":120},"tags":{"type":"array","items":{"type":"string"},"maxItems":3}},
        "required":["name"]})")),
      json_object_ebnf(),
      "root ::= " + regex_to_ebnf("(tr|true|[a-e]{1,3}-\\d+)+", RegexContext::kText),
  };
  std::mt19937 rng(11);
  for (const auto& text : grammars) {
    const auto compiled = std::make_shared<CompiledGrammar>(Grammar::from_ebnf(text), vocab);
    for (int walk = 0; walk < 12; ++walk) {
      TokenMatcher m(compiled);
      std::vector<uint64_t> mask(vocab->mask_words());
      for (int step = 0; step < 40 && !m.ended(); ++step) {
        m.fill_mask(mask);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < vocab->size(); ++id) {
          const bool bit = (mask[static_cast<std::size_t>(id) / 64] >> (id % 64)) & 1;
          const bool brute = m.accept_token(id);  // try the token itself: the brute-force answer
          if (brute) m.rollback(1);
          INFO(text.substr(0, 60) << " walk " << walk << " step " << step << " token " << id << " '" << vocab->bytes(id) << "'");
          REQUIRE(bit == brute);
          if (bit) allowed.push_back(id);
        }
        REQUIRE_FALSE(allowed.empty());  // these grammars never dead-end
        // prefer non-end tokens early so walks go somewhere
        int32_t pick = allowed[rng() % allowed.size()];
        if (pick == 0 && allowed.size() > 1 && step < 30) pick = allowed[1 + rng() % (allowed.size() - 1)];
        REQUIRE(m.accept_token(pick));
      }
    }
  }
}

TEST_CASE("a special token is read only where a grammar names it, never spelled by other tokens", "[grammar]") {
  // ids: 0 ends; 1 [TOOL_CALLS] as a special token; 2 the same text as ordinary tokens would spell it;
  // 3 a byte token 0xFF; 4..: pieces of the marker, '[', 'x', '{', '}'.
  std::vector<std::string> v{"", "[TOOL_CALLS]", "[TOOL_CALLS]", "\xFF", "[", "TOOL", "_CALLS", "]", "x", "{", "}"};
  v.push_back(special_token_spelling(1).substr(0, 3));  // 11: an ordinary token holding part of the spelling
  const auto vocab = std::make_shared<Vocabulary>(v, std::vector<int32_t>{0}, std::vector<int32_t>{1});
  const auto allowed = [&](const std::string& ebnf, const std::vector<int32_t>& prefix) {
    TokenMatcher m(std::make_shared<CompiledGrammar>(Grammar::from_ebnf(ebnf), vocab));
    for (const int32_t t : prefix) REQUIRE(m.accept_token(t));
    std::vector<uint64_t> mask(vocab->mask_words());
    m.fill_mask(mask);
    std::vector<int32_t> out;
    for (int32_t id = 0; id < vocab->size(); ++id) {
      if ((mask[static_cast<std::size_t>(id) / 64] >> (id % 64)) & 1) out.push_back(id);
    }
    return out;
  };
  CHECK(allowed("root ::= <[1]> \"[\" \"x\" \"]\"", {}) == std::vector<int32_t>{1});
  CHECK(allowed("root ::= <[1]> \"[\" \"x\" \"]\"", {1}) == std::vector<int32_t>{4});
  CHECK(allowed("root ::= \"x\"? <[1]>", {}) == std::vector<int32_t>{1, 8});
  // Where a grammar reads text, the special token is not text, and the ordinary spelling is.
  CHECK(allowed("root ::= \"[TOOL_CALLS]\"", {}) == std::vector<int32_t>{2, 4});
  CHECK(allowed("root ::= [^\\x00]*", {}) == std::vector<int32_t>{0, 2, 4, 5, 6, 7, 8, 9, 10});
  CHECK_THROWS_WITH(parse_ebnf("root ::= <[x]>"), Catch::Contains("expected a token id and ']>'"));
  CHECK_THROWS_WITH(parse_ebnf("root ::= <tool>"), Catch::Contains("expected '<[' to begin a token reference"));
}
