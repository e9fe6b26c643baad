// Tool calling on rank 0 (router/tool_calls.h): the request's tools read and
// checked; the grammar that holds an answer to the model's call format under
// each tool_choice; the finished text split into content and calls; the
// response and stream shapes OpenAI's clients read.
#include <catch2/catch.hpp>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "router/batch_output.h"
#include "router/batch_request.h"
#include "router/openai_stream.h"
#include "router/tool_calls.h"

using namespace tandem::router;
using tandem::runtime::ToolFormat;
using ojson = nlohmann::ordered_json;

namespace {

const char* const kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "ping"}}])";

ToolRequest tools_with(const std::string& extra = "") {
  auto t = parse_tools(ojson::parse(std::string(R"({"tools": )") + kTools + extra + "}"));
  REQUIRE(t);
  return *t;
}

std::string error_of(const std::string& body) {
  try {
    parse_tools(ojson::parse(body));
  } catch (const tandem::Error& e) {
    return e.what();
  }
  return "";
}

bool accepts(const std::string& ebnf, const std::string& text) {
  tandem::grammar::Matcher m(tandem::grammar::Grammar::from_ebnf(ebnf));
  return m.accept(text) && m.can_end();
}

const std::string kParis = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"days\":2}}\n</tool_call>";
const std::string kPing = "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";

}  // namespace

TEST_CASE("tools: read with their order, choices and refusals naming the field", "[router][tools]") {
  auto t = tools_with();
  CHECK(t.names == std::vector<std::string>{"get_weather", "ping"});
  CHECK(t.choice == ToolChoice::kAuto);  // OpenAI's default when tools are given
  CHECK(t.parallel);
  CHECK(t.tools[0]["function"].begin().key() == "name");  // key order kept for the template
  CHECK(tools_with(R"(, "tool_choice": "required", "parallel_tool_calls": false)").choice == ToolChoice::kRequired);
  CHECK_FALSE(tools_with(R"(, "parallel_tool_calls": false)").parallel);
  auto named = tools_with(R"(, "tool_choice": {"type": "function", "function": {"name": "ping"}})");
  CHECK(named.choice == ToolChoice::kNamed);
  CHECK(named.named == "ping");
  CHECK(tools_with(R"(, "tool_choice": "none")").choice == ToolChoice::kNone);
  CHECK_FALSE(parse_tools(ojson::parse(R"({"tools": [], "tool_choice": "none"})")));

  CHECK_THAT(error_of(R"({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})"),
             Catch::Contains("'tool_choice' names the function 'g', which is not in 'tools'"));
  CHECK_THAT(error_of(R"({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "any"})"),
             Catch::Contains("'tool_choice' must be \"none\", \"auto\", \"required\""));
  CHECK_THAT(error_of(R"({"tool_choice": "required"})"), Catch::Contains("needs 'tools'"));
  CHECK_THAT(error_of(R"({"tools": [{"type": "custom", "custom": {"name": "f"}}]})"),
             Catch::Contains("'tools[0].custom' is not a field of a tool"));
  CHECK_THAT(error_of(R"({"tools": [{"type": "retrieval", "function": {"name": "f"}}]})"),
             Catch::Contains("'tools[0].type' must be \"function\""));
  CHECK_THAT(error_of(R"({"tools": [{"type": "function", "function": {"name": "f", "paramters": {}}}]})"),
             Catch::Contains("'tools[0].function.paramters' is not a field of a function"));
  CHECK_THAT(error_of(R"({"tools": [{"type": "function", "function": {"name": "get weather"}}]})"),
             Catch::Contains("'tools[0].function.name' must be 1 to 64 letters"));
  CHECK_THAT(error_of(R"({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]})"),
             Catch::Contains("'tools[1].function.name' 'f' is given twice"));
  CHECK_THAT(error_of(R"({"functions": [{"name": "f"}]})"), Catch::Contains("'functions' is OpenAI's deprecated form"));
  CHECK_THAT(error_of(R"({"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": 1})"),
             Catch::Contains("'parallel_tool_calls' must be true or false"));
}

TEST_CASE("Qwen3's calls: the grammar of each tool_choice", "[router][tools]") {
  const std::string think = "<think>\nThe user wants weather.\n</think>\n\n";
  SECTION("auto: text, then calls of declared functions with valid arguments") {
    const auto g = tool_grammar(ToolFormat::kHermes, tools_with(), true);
    CHECK(accepts(g, "It is sunny."));
    CHECK(accepts(g, ""));
    CHECK(accepts(g, think + "Let me check.\n" + kParis));
    CHECK(accepts(g, kParis + "\n" + kPing));
    CHECK_FALSE(accepts(g, kParis + " and more text"));
    CHECK_FALSE(accepts(g, "<tool_call>\n{\"name\": \"delete_all\", \"arguments\": {}}\n</tool_call>"));
    CHECK_FALSE(accepts(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\":2}}\n</tool_call>"));
    CHECK_FALSE(accepts(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"days\":9}}\n</tool_call>"));
  }
  SECTION("none: no call can begin") {
    const auto g = tool_grammar(ToolFormat::kHermes, tools_with(R"(, "tool_choice": "none")"), true);
    CHECK(accepts(g, think + "It is sunny."));
    CHECK_FALSE(accepts(g, kPing));
    CHECK_FALSE(accepts(g, "text <tool_call>"));
  }
  SECTION("required: calls only, after thinking where the template thinks first") {
    const auto t = tools_with(R"(, "tool_choice": "required")");
    const auto g = tool_grammar(ToolFormat::kHermes, t, true);
    CHECK(accepts(g, kParis));
    CHECK(accepts(g, think + kParis + "\n" + kPing));
    CHECK_FALSE(accepts(g, ""));
    CHECK_FALSE(accepts(g, "Sure. " + kParis));
    CHECK_FALSE(accepts(g, think));
    CHECK_FALSE(accepts(tool_grammar(ToolFormat::kHermes, t, false), think + kParis));
    const auto one = tool_grammar(ToolFormat::kHermes, tools_with(R"(, "tool_choice": "required", "parallel_tool_calls": false)"), false);
    CHECK(accepts(one, kParis));
    CHECK_FALSE(accepts(one, kParis + "\n" + kPing));
  }
  SECTION("a named function: one call of it") {
    const auto g = tool_grammar(ToolFormat::kHermes,
                                tools_with(R"(, "tool_choice": {"type": "function", "function": {"name": "ping"}})"), false);
    CHECK(accepts(g, kPing));
    CHECK_FALSE(accepts(g, kParis));
    CHECK_FALSE(accepts(g, kPing + "\n" + kPing));
  }
  SECTION("a parameter schema keyword that is not enforced is refused, naming the function") {
    auto t = parse_tools(ojson::parse(R"({"tools": [{"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 2}}}}}]})"));
    REQUIRE(t);
    CHECK_THROWS_WITH(tool_grammar(ToolFormat::kHermes, *t, false),
                      Catch::Contains("function 'f' (tools[0].function.parameters): JSON schema at /properties/x: "
                                      "'multipleOf' is not supported"));
  }
}

TEST_CASE("Qwen3's calls: the finished text split into content and calls", "[router][tools]") {
  const auto t = tools_with();
  auto a = parse_tool_answer(ToolFormat::kHermes, t, "Let me check.\n" + kParis + "\n" + kPing + "\n", "line-7/0");
  REQUIRE(a);
  CHECK(a->content == "Let me check.\n");
  REQUIRE(a->calls.size() == 2);
  CHECK(a->calls[0].name == "get_weather");
  CHECK(a->calls[0].arguments == "{\"city\":\"Paris\",\"days\":2}");  // as the model wrote it
  CHECK(a->calls[1].arguments == "{}");
  CHECK(a->calls[0].id.rfind("call_", 0) == 0);
  CHECK(a->calls[0].id != a->calls[1].id);
  // Ids come from the request: a rerun writes the same, another choice others.
  CHECK(parse_tool_answer(ToolFormat::kHermes, t, kParis, "line-7/0")->calls[0].id == a->calls[0].id);
  CHECK(parse_tool_answer(ToolFormat::kHermes, t, kParis, "line-7/1")->calls[0].id != a->calls[0].id);
  // Spacing the model may use inside a call, and nested values, keep their text.
  auto spaced = parse_tool_answer(ToolFormat::kHermes, t,
                                  "<tool_call>\n{ \"arguments\" : {\"city\": \"a,b}\", \"x\": [1, {\"y\": \"]\"}]} , \"name\": \"get_weather\" }\n</tool_call>",
                                  "k");
  REQUIRE(spaced);
  CHECK(spaced->calls[0].arguments == "{\"city\": \"a,b}\", \"x\": [1, {\"y\": \"]\"}]}");
  // Anything else is content: no call, a call cut off, an undeclared function, text after a call.
  CHECK_FALSE(parse_tool_answer(ToolFormat::kHermes, t, "It is sunny.", "k"));
  CHECK_FALSE(parse_tool_answer(ToolFormat::kHermes, t, kParis.substr(0, kParis.size() - 3), "k"));
  CHECK_FALSE(parse_tool_answer(ToolFormat::kHermes, t, "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>", "k"));
  CHECK_FALSE(parse_tool_answer(ToolFormat::kHermes, t, kParis + " done", "k"));
  CHECK_FALSE(parse_tool_answer(ToolFormat::kHermes, t, "<tool_call>\nnot json\n</tool_call>", "k"));
}

TEST_CASE("Llama 3.1's calls: the whole answer is one call, or text that does not begin one", "[router][tools]") {
  const std::string paris = "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Paris\"}}";
  const auto t = tools_with();
  const auto g = tool_grammar(ToolFormat::kLlama3Json, t, false);
  CHECK(accepts(g, paris));
  CHECK(accepts(g, "It is sunny."));
  CHECK(accepts(g, "{\"weather\": \"sunny\"}"));  // JSON that is not a call is text
  CHECK_FALSE(accepts(g, "{\"name\": \"rm\", \"parameters\": {}}"));
  CHECK_FALSE(accepts(g, paris + "\n" + paris));  // one call per answer, as Meta's template holds
  const auto req = tool_grammar(ToolFormat::kLlama3Json, tools_with(R"(, "tool_choice": "required")"), false);
  CHECK(accepts(req, paris));
  CHECK_FALSE(accepts(req, "It is sunny."));
  const auto none = tool_grammar(ToolFormat::kLlama3Json, tools_with(R"(, "tool_choice": "none")"), false);
  CHECK(accepts(none, "It is sunny."));
  CHECK_FALSE(accepts(none, paris));

  auto a = parse_tool_answer(ToolFormat::kLlama3Json, t, paris, "k/0");
  REQUIRE(a);
  CHECK(a->content.empty());
  REQUIRE(a->calls.size() == 1);
  CHECK(a->calls[0].name == "get_weather");
  CHECK(a->calls[0].arguments == "{\"city\":\"Paris\"}");
  CHECK_FALSE(parse_tool_answer(ToolFormat::kLlama3Json, t, "It is sunny.", "k"));
  CHECK_FALSE(parse_tool_answer(ToolFormat::kLlama3Json, t, paris.substr(0, 30), "k"));
  CHECK(tool_content_end(ToolFormat::kLlama3Json, "{\"na") == 0);  // may still become a call
  CHECK(tool_content_end(ToolFormat::kLlama3Json, paris) == 0);
  CHECK(tool_content_end(ToolFormat::kLlama3Json, "It is") == 5);
  CHECK(tool_content_end(ToolFormat::kLlama3Json, "{\"weather") == 9);
}

TEST_CASE("Mistral's calls: the [TOOL_CALLS] token, then a JSON list of calls", "[router][tools]") {
  const auto t = tools_with();
  const std::string marker = tandem::grammar::special_token_spelling(9);  // how a grammar reads token 9
  const std::string paris = "{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}";
  const std::string ping = "{\"name\": \"ping\", \"arguments\": {}}";
  const auto g = tool_grammar(ToolFormat::kMistral, t, false, 9);
  CHECK(accepts(g, marker + "[" + paris + ", " + ping + "]"));
  CHECK(accepts(g, "Checking." + marker + "[" + ping + "]"));
  CHECK(accepts(g, "It is sunny."));
  CHECK_FALSE(accepts(g, "[TOOL_CALLS][" + ping + "]"));  // spelled in text, not the token
  CHECK_FALSE(accepts(g, marker + "[" + ping + "] and more"));
  CHECK_FALSE(accepts(g, marker + "[{\"name\": \"rm\", \"arguments\": {}}]"));
  const auto one = tool_grammar(ToolFormat::kMistral, tools_with(R"(, "tool_choice": "required", "parallel_tool_calls": false)"), false, 9);
  CHECK(accepts(one, marker + "[" + paris + "]"));
  CHECK_FALSE(accepts(one, marker + "[" + paris + ", " + ping + "]"));
  CHECK_FALSE(accepts(one, "It is sunny."));
  CHECK_THROWS_WITH(tool_grammar(ToolFormat::kMistral, t, false, -1), Catch::Contains("no [TOOL_CALLS] token"));

  // The text as tool_answer puts it back together: the token's own text where it came.
  auto a = parse_tool_answer(ToolFormat::kMistral, t, "Checking.[TOOL_CALLS][" + paris + ", " + ping + "]", "m/0");
  REQUIRE(a);
  CHECK(a->content == "Checking.");
  REQUIRE(a->calls.size() == 2);
  CHECK(a->calls[0].arguments == "{\"city\":\"Paris\"}");
  CHECK(a->calls[1].name == "ping");
  for (const auto& c : a->calls) {  // Mistral's template takes back only ids of 9 letters and digits
    CHECK(c.id.size() == 9);
    CHECK(std::all_of(c.id.begin(), c.id.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)); }));
  }
  CHECK(a->calls[0].id != a->calls[1].id);
  CHECK_FALSE(parse_tool_answer(ToolFormat::kMistral, t, "[TOOL_CALLS][" + paris, "m"));
  CHECK_FALSE(parse_tool_answer(ToolFormat::kMistral, t, "It is sunny.", "m"));
  CHECK(tool_content_end(ToolFormat::kMistral, "Checking.[TOOL_C") == 9);
}

TEST_CASE("tools: what a stream may send before the answer is finished", "[router][tools]") {
  CHECK(tool_content_end(ToolFormat::kHermes, "Let me check.") == 13);
  CHECK(tool_content_end(ToolFormat::kHermes, "Let me check.\n<tool") == 14);
  CHECK(tool_content_end(ToolFormat::kHermes, "a < b") == 5);
  CHECK(tool_content_end(ToolFormat::kHermes, "a <") == 2);
  CHECK(tool_content_end(ToolFormat::kHermes, "x" + kParis + "more") == 1);
  CHECK(tool_content_end(ToolFormat::kNone, "x" + kParis) == 1 + kParis.size());
}

TEST_CASE("tools: a chat request's calls in the response, message history with calls", "[router][tools]") {
  auto p = parse_batch_line(std::string(R"({"custom_id": "w1", "messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_a", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "call_a", "content": "5 C"}], "tools": )") + kTools + "}");
  REQUIRE(std::holds_alternative<BatchRequest>(p));
  auto req = std::get<BatchRequest>(p);
  REQUIRE(req.tools);
  REQUIRE(req.messages->size() == 3);
  CHECK((*req.messages)[1].tool_calls.at(0).name == "get_weather");
  CHECK((*req.messages)[1].tool_calls.at(0).arguments == "{\"city\": \"Oslo\"}");
  CHECK((*req.messages)[2].tool_call_id == "call_a");
  req.tool_format = ToolFormat::kHermes;  // as build_prompt sets it for a Qwen3 template

  RequestResult res;
  res.text = kPing;
  res.finish_reason = "stop";
  auto body = response_body(req, {res}, {}, "chatcmpl-x");  // (no tokenizer: Qwen3's calls are read from the text)
  const auto& c = body["choices"][0];
  CHECK(c["finish_reason"] == "tool_calls");
  CHECK(c["message"]["content"].is_null());
  CHECK(c["message"]["tool_calls"][0]["type"] == "function");
  CHECK(c["message"]["tool_calls"][0]["function"]["name"] == "ping");
  CHECK(c["message"]["tool_calls"][0]["function"]["arguments"] == "{}");
  res.text = "Cold.";
  CHECK(response_body(req, {res}, {}, "x")["choices"][0]["message"]["content"] == "Cold.");
  CHECK(response_body(req, {res}, {}, "x")["choices"][0]["finish_reason"] == "stop");
  res.text = kPing;  // cut off by max_tokens after a whole call: the calls, and the reason it ended
  res.finish_reason = "length";
  CHECK(response_body(req, {res}, {}, "x")["choices"][0]["finish_reason"] == "length");

  auto chunk = tool_calls_chunk(req, {"chatcmpl-x", "m", 1}, 0, parse_tool_answer(ToolFormat::kHermes, *req.tools, kPing, "k")->calls, true);
  const auto& d = chunk["choices"][0]["delta"];
  CHECK(d["role"] == "assistant");
  CHECK(d["tool_calls"][0]["index"] == 0);
  CHECK(d["tool_calls"][0]["function"]["arguments"] == "{}");

  auto bad = parse_batch_line(R"({"custom_id": "w2", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}})");
  REQUIRE(std::holds_alternative<LineError>(bad));
  CHECK_THAT(std::get<LineError>(bad).message, Catch::Contains("both constrain the answer"));
  CHECK(std::holds_alternative<BatchRequest>(parse_batch_line(R"({"custom_id": "w3", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none", "response_format": {"type": "json_object"}})")));
  auto user_call = parse_batch_line(R"({"custom_id": "w4", "messages": [{"role": "user", "content": "x",
      "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})");
  REQUIRE(std::holds_alternative<LineError>(user_call));
  CHECK_THAT(std::get<LineError>(user_call).message, Catch::Contains("only an assistant makes tool_calls"));
}
