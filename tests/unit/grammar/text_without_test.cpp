// Free text without a marker (grammar/text_without.h): exactly the texts in
// which the marker does not occur, whatever surrounds or repeats its parts;
// and several schemas' rules side by side in one grammar (json_schema_rules).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "common/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/text_without.h"

using namespace tandem::grammar;

namespace {

bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.accept(text) && m.can_end();
}

}  // namespace

TEST_CASE("text without a marker: every short text over the marker's letters", "[grammar]") {
  // All 4^0 + ... + 4^8 texts over {'<', 'a', 'b', 'c'}: 87,381 of them.
  const std::string marker = "<ab";
  const auto g = Grammar::from_ebnf("root ::= " + ebnf_text_without(marker));
  const std::string letters = "<abc";
  int checked = 0, with_marker = 0;
  for (int len = 0; len <= 8; ++len) {
    std::vector<int> digits(static_cast<std::size_t>(len), 0);
    while (true) {
      std::string text;
      for (int d : digits) text += letters[static_cast<std::size_t>(d)];
      const bool clean = text.find(marker) == std::string::npos;
      INFO(text);
      REQUIRE(accepts(g, text) == clean);
      ++checked;
      with_marker += !clean;
      int k = len - 1;
      while (k >= 0 && ++digits[static_cast<std::size_t>(k)] == 4) digits[static_cast<std::size_t>(k--)] = 0;
      if (k < 0) break;
    }
  }
  CHECK(checked == 87381);
  CHECK(with_marker == 7628);  // the texts that hold "<ab", as Python counts them
}

TEST_CASE("text without <tool_call>: pieces of the marker in any order, and other characters", "[grammar]") {
  const std::string marker = "<tool_call>";
  const auto g = Grammar::from_ebnf("root ::= " + ebnf_text_without(marker));
  const std::vector<std::string> pieces = {"<", "<tool", "_call", ">", "<tool_call", "tool_call>", "t", "l", "<<",
                                           "\n", " ", "é", "</tool_call>", "<tool_cal", "x"};
  std::mt19937 rng(7);
  int with_marker = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text;
    const int n = static_cast<int>(rng() % 9);
    for (int k = 0; k < n; ++k) text += pieces[rng() % pieces.size()];
    const bool clean = text.find(marker) == std::string::npos;
    with_marker += !clean;
    INFO(text);
    REQUIRE(accepts(g, text) == clean);
  }
  CHECK(with_marker > 100);
  CHECK(accepts(g, "<think>\nweather first\n</think>\n\n"));
  CHECK_FALSE(accepts(g, "sure: <tool_call>"));
}

TEST_CASE("text not starting with a prefix: every short text over its letters", "[grammar]") {
  const std::string prefix = "{\"n";
  const auto g = Grammar::from_ebnf("root ::= " + ebnf_text_not_starting_with(prefix));
  const std::string letters = "{\"nx";
  int checked = 0;
  for (int len = 0; len <= 6; ++len) {
    std::vector<int> digits(static_cast<std::size_t>(len), 0);
    while (true) {
      std::string text;
      for (int d : digits) text += letters[static_cast<std::size_t>(d)];
      INFO(text);
      REQUIRE(accepts(g, text) == (text.rfind(prefix, 0) != 0));
      ++checked;
      int k = len - 1;
      while (k >= 0 && ++digits[static_cast<std::size_t>(k)] == 4) digits[static_cast<std::size_t>(k--)] = 0;
      if (k < 0) break;
    }
  }
  CHECK(checked == 5461);
  CHECK(accepts(g, std::string("\x00\xC3\xA9\xF0\x9F\x98\x80 any character after the first")));
  CHECK_FALSE(accepts(g, "{\"name\": \"f\"}"));
}

TEST_CASE("text without: markers it cannot avoid exactly are refused", "[grammar]") {
  CHECK_THROWS_AS(ebnf_text_without("<"), tandem::Error);
  CHECK_THROWS_AS(ebnf_text_without("<a<"), tandem::Error);    // the first byte again
  CHECK_THROWS_AS(ebnf_text_without("<\xC3\xA9>"), tandem::Error);  // not ASCII
  CHECK_NOTHROW(ebnf_text_without("[TOOL_CALLS]"));
}

TEST_CASE("json_schema_rules: two schemas in one grammar keep their own rules", "[grammar]") {
  const auto a = nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}}, "required": ["city"]})");
  const auto b = nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["n"]})");
  const auto g = Grammar::from_ebnf("root ::= \"A\" fa | \"B\" fb\n" + json_schema_rules(a, "fa") +
                                    json_schema_rules(b, "fb") + json_basics_ebnf());
  CHECK(accepts(g, R"(A{"city":"Oslo"})"));
  CHECK(accepts(g, R"(B{"n":3})"));
  CHECK_FALSE(accepts(g, R"(A{"n":3})"));
  CHECK_FALSE(accepts(g, R"(B{"n":4})"));
  CHECK_FALSE(accepts(g, R"(A{"city":"Berlin"})"));
}
