#include <catch2/catch.hpp>

#include "common/error.h"
#include "router/batch_request.h"
#include "router/body_defaults.h"

using namespace tandem::router;

namespace {
std::string error_of(const std::string& line) {
  auto p = parse_batch_line(line);
  REQUIRE(std::holds_alternative<LineError>(p));
  return std::get<LineError>(p).message;
}
BatchRequest ok(const std::string& line) {
  auto p = parse_batch_line(line);
  if (auto* e = std::get_if<LineError>(&p)) FAIL(e->message);
  return std::get<BatchRequest>(p);
}
}  // namespace

TEST_CASE("Batch lines in both forms, with every option by its OpenAI name", "[router][input]") {
  auto r = ok(R"({"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}]}],"max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":5,"min_p":0.1,"presence_penalty":0.2,"frequency_penalty":0.3,"repetition_penalty":1.2,"seed":4,"stop":"END","stop_token_ids":[2],"logprobs":true,"top_logprobs":3,"ignore_eos":true}})");
  CHECK(r.endpoint == Endpoint::kChat);
  CHECK(r.model == "m");
  REQUIRE(r.messages);
  CHECK((*r.messages)[0].content == "Hi there");
  CHECK(r.params.max_tokens == 7);
  CHECK(r.max_tokens_given);
  CHECK(r.params.temperature == 0.5f);
  CHECK(r.params.top_k == 5);
  CHECK(r.params.seed == 4);
  CHECK(r.seed_given);
  CHECK(r.params.stop == std::vector<std::string>{"END"});
  CHECK(r.params.logprobs == 3);
  CHECK(r.params.ignore_eos);

  auto s = ok(R"({"custom_id":"b","prompt_token_ids":[1,2,3],"max_tokens":4})");
  CHECK(s.endpoint == Endpoint::kCompletions);
  CHECK(s.prompt_ids == std::vector<int32_t>{1, 2, 3});
  auto t = ok(R"({"custom_id":"c","prompt":"x","echo":true,"logprobs":2})");
  CHECK(t.echo);
  CHECK(t.params.prompt_logprobs == 2);
  CHECK(t.params.max_tokens == 16);  // OpenAI's default for completions
}

TEST_CASE("bad lines say what is wrong and how to fix it", "[router][input]") {
  CHECK_THAT(error_of("{not json"), Catch::StartsWith("not valid JSON at column 3: syntax error") &&
                                       Catch::EndsWith("; each line must be one JSON object"));
  // A line broken after its custom_id (a number too large for a double, a line cut short) keeps the id.
  for (const char* broken : {R"({"custom_id":"big","prompt":"x","temperature":1e400})", R"({"custom_id":"cut","prompt":"x)"}) {
    auto b = parse_batch_line(broken);
    REQUIRE(std::holds_alternative<LineError>(b));
    CHECK(std::get<LineError>(b).custom_id == (std::string(broken).find("big") != std::string::npos ? "big" : "cut"));
    CHECK_THAT(std::get<LineError>(b).message, Catch::StartsWith("not valid JSON at "));
  }
  CHECK_THAT(std::get<LineError>(parse_batch_line(R"({"custom_id":"big","temperature":1e400})")).message,
             Catch::Contains("at byte 38 (number overflow parsing '1e400')"));
  // Only the line's own custom_id, not one nested inside it.
  auto nested = parse_batch_line(R"({"body":{"custom_id":"inner"},"x":tru})");
  REQUIRE(std::holds_alternative<LineError>(nested));
  CHECK(std::get<LineError>(nested).custom_id.empty());
  CHECK(error_of("[1,2]") == "each line must be a JSON object, got an array");
  CHECK(error_of(R"({"prompt":"x"})") == "missing 'custom_id' (every line needs a unique string id)");
  CHECK(error_of(R"({"custom_id":7,"prompt":"x"})") == "'custom_id' must be a non-empty string, got 7");
  CHECK_THAT(error_of(R"({"custom_id":"a","method":"POST","url":"/v1/files","body":{}})"),
             Catch::StartsWith("unknown 'url' \"/v1/files\"; use \"/v1/completions\","));
  CHECK(error_of(R"({"custom_id":"a","prompt":"x","max_tokens":0})") == "'max_tokens' must be at least 1, got 0");
  CHECK(error_of(R"({"custom_id":"a","prompt":"x","temperature":"hot"})") == "'temperature' must be a number, got a string");
  CHECK(error_of(R"({"custom_id":"a","prompt":"x","top_p":1.5})") == "'top_p' must be between 0.0 and 1.0, got 1.5");
  CHECK(error_of(R"({"custom_id":"a","prompt":"x","n":2})") == "'n' must be 1 (write one line per sample, with different seeds)");
  CHECK(error_of(R"({"custom_id":"a","prompt":["x","y"]})") ==
        "'prompt' must be a string or an array of token ids (one prompt per line)");
  CHECK(error_of(R"({"custom_id":"a","messages":[]})") == "'messages' must be a non-empty array of {role, content}");
  CHECK(error_of(R"({"custom_id":"a","prompt_token_ids":[1,-2]})") ==
        "'prompt_token_ids' must hold non-negative integer token ids, got -2");
  CHECK(error_of(R"({"custom_id":"a"})") == "a completion request needs 'prompt' (or 'prompt_token_ids')");
  auto p = parse_batch_line(R"({"custom_id":"keep-me","prompt":"x","stop":5})");
  REQUIRE(std::holds_alternative<LineError>(p));
  CHECK(std::get<LineError>(p).custom_id == "keep-me");  // the error line carries the id when it could be read
}

TEST_CASE("fields that would change the result and are not honoured are refused, naming the field",
          "[router][input]") {
  // Batch lines (both forms) and HTTP bodies alike.
  auto http_error = [](Endpoint e, const std::string& body) {
    auto p = parse_request_body(e, body);
    REQUIRE(std::holds_alternative<LineError>(p));
    CHECK(std::get<LineError>(p).status == 400);
    return std::get<LineError>(p).message;
  };
  const std::string chat = R"({"custom_id":"a","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"hi"}],)";
  // Tools are a chat's (router/tool_calls_test.cpp checks them); a completion refuses them.
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","tools":[{"type":"function","function":{"name":"f"}}]})"),
             Catch::Contains("'tools' is not supported: tools are for chat completions"));
  CHECK_THAT(error_of(chat + R"("tool_choice":"required"}})"), Catch::Contains("'tool_choice' \"required\" needs 'tools'"));
  CHECK_THAT(error_of(chat + R"("chat_template_kwargs":{"enable_thinking":false,"foo":1}}})"),
             Catch::Contains("'chat_template_kwargs.foo' is not supported"));
  CHECK(ok(chat + R"("chat_template_kwargs":{"enable_thinking":false}}})").enable_thinking == false);
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","suffix":"y"})"), Catch::Contains("'suffix' is not supported"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","best_of":3})"), Catch::Contains("'best_of' is not supported"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","guided_decoding_backend":"xgrammar"})"),
             Catch::Contains("'guided_decoding_backend' is not supported"));
  CHECK_THAT(http_error(Endpoint::kChat, R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]})"),
             Catch::Contains("'tools[0].function' must be an object"));
  // A field nobody knows is a mistake, most often a typo: never a silent default.
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","max_token":100})"),
             Catch::Contains("unknown field 'max_token'; did you mean 'max_tokens'?"));
  CHECK_THAT(http_error(Endpoint::kCompletions, R"({"prompt":"x","temprature":0.5})"),
             Catch::Contains("unknown field 'temprature'; did you mean 'temperature'?"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","top_logprobs":2})"), Catch::Contains("unknown field 'top_logprobs'"));
  // Values that ask for what Tandem does anyway, and bookkeeping fields, are accepted.
  ok(chat + R"("response_format":{"type":"text"},"tools":[],"tool_choice":"none","user":"u","metadata":{"k":"v"},"store":false,"parallel_tool_calls":true,"n":1,"best_of":null}})");
  ok(R"({"custom_id":"a","messages":[{"role":"user","content":"hi","name":"ann"},{"role":"assistant","content":"x","tool_calls":[]}]})");
  ok(R"({"custom_id":"a","prompt":"x","best_of":1,"skip_special_tokens":true,"user":"u"})");
}

TEST_CASE("logit_bias and min_tokens are read and checked", "[router][input]") {
  auto r = ok(R"({"custom_id":"a","prompt":"x","max_tokens":9,"logit_bias":{"50256":-100,"7":2.5,"12":100},"min_tokens":3})");
  CHECK(r.params.logit_bias == std::vector<std::pair<int32_t, float>>{{7, 2.5f}, {12, 100.0f}, {50256, -100.0f}});
  CHECK(r.params.min_tokens == 3);
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","logit_bias":{"x":1}})"), Catch::Contains("'logit_bias' keys must be token ids"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","logit_bias":{"5":101}})"), Catch::Contains("from -100 to 100"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","logit_bias":[1]})"), Catch::Contains("'logit_bias' must be an object"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","max_tokens":4,"min_tokens":5})"),
             Catch::Contains("'min_tokens' (5) must be at most max_tokens (4)"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","min_tokens":-1})"), Catch::Contains("'min_tokens' must be at least 0"));
}

TEST_CASE("fields that would be ignored or misread are refused, naming the field", "[router][input]") {
  // Two prompts: which one is meant is unknown.
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"text","prompt_token_ids":[1,2]})"),
             Catch::Contains("give 'prompt' or 'prompt_token_ids', not both"));
  CHECK(ok(R"({"custom_id":"a","prompt":null,"prompt_token_ids":[1,2]})").prompt_ids == std::vector<int32_t>{1, 2});
  // A key given twice in one object: JSON keeps the last one without a word.
  auto twice = parse_batch_line(R"({"custom_id":"first","prompt":"a","prompt":"b","custom_id":"second"})");
  REQUIRE(std::holds_alternative<LineError>(twice));
  CHECK_THAT(std::get<LineError>(twice).message, Catch::Contains("the key 'prompt' is given twice in one object"));
  CHECK(std::get<LineError>(twice).custom_id == "first");  // as the line is keyed
  CHECK_THAT(error_of(R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"x","max_tokens":2,"max_tokens":3}})"),
             Catch::Contains("the key 'max_tokens' is given twice"));
  // The same key in two objects is no duplicate.
  ok(R"({"custom_id":"a","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]})");
  std::string many = R"({"custom_id":"a","prompt":"x","logit_bias":{)";
  for (int i = 0; i < 200; ++i) many += (i ? "," : "") + std::string("\"") + std::to_string(i) + "\":1";
  CHECK(ok(many + "}}").params.logit_bias.size() == 200);
  CHECK_THAT(error_of(many + ",\"150\":2}}"), Catch::Contains("the key '150' is given twice"));
  CHECK_THAT(std::get<LineError>(parse_request_body(Endpoint::kCompletions, R"({"prompt":"a","prompt":"b"})")).message,
             Catch::Contains("given twice"));
  // top_logprobs without logprobs (OpenAI answers 400).
  CHECK_THAT(error_of(R"({"custom_id":"a","messages":[{"role":"user","content":"x"}],"top_logprobs":3})"),
             Catch::Contains("'top_logprobs' needs 'logprobs': true"));
  CHECK(ok(R"({"custom_id":"a","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":3})").params.logprobs == 3);
  // Seeds: 0 to 2^64-1; a negative one has no meaning.
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","seed":-1})"),
             Catch::Contains("'seed' must be an integer from 0 to 2^64-1, got -1"));
  CHECK(ok(R"({"custom_id":"a","prompt":"x","seed":18446744073709551615})").params.seed == UINT64_MAX);
  // Integers past int64 are named as too large, not as negative.
  CHECK(error_of(R"({"custom_id":"a","prompt":"x","max_tokens":9223372036854775808})") ==
        "'max_tokens' must be at most 9223372036854775807, got 9223372036854775808");
  // echo with logprobs asks for the prompt's logprobs, but does not add the prompt_logprobs field.
  auto echo = ok(R"({"custom_id":"c","prompt":"x","echo":true,"logprobs":2})");
  CHECK(echo.params.prompt_logprobs == 2);
  CHECK_FALSE(echo.prompt_logprobs_asked);
  CHECK(ok(R"({"custom_id":"c","prompt":"x","prompt_logprobs":1})").prompt_logprobs_asked);
}

TEST_CASE("structured outputs: each field becomes the grammar the workers use, or one clear error", "[router][input]") {
  auto ok_line = [](const std::string& line) {
    auto p = parse_batch_line(line);
    if (auto* e = std::get_if<LineError>(&p)) FAIL(e->message);
    return std::get<BatchRequest>(p);
  };
  auto error_of = [](const std::string& line) {
    auto p = parse_batch_line(line);
    REQUIRE(std::holds_alternative<LineError>(p));
    return std::get<LineError>(p).message;
  };
  const std::string chat = R"({"custom_id":"a","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"hi"}],)";
  CHECK(ok_line(chat + R"("response_format":{"type":"text"}}})").params.grammar.empty());
  CHECK_THAT(ok_line(chat + R"("response_format":{"type":"json_object"}}})").params.grammar,
             Catch::Contains("root ::= json_object"));
  // The schema's property order is kept: "zeta" before "alpha", as written.
  const auto schema = ok_line(chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}}}}}}})");
  const std::string& g = schema.params.grammar;
  REQUIRE(g.find("zeta") != std::string::npos);
  CHECK(g.find("zeta") < g.find("alpha"));
  CHECK_THAT(ok_line(R"({"custom_id":"a","prompt":"x","structured_outputs":{"regex":"[0-9]{3}"}})").params.grammar,
             Catch::Contains("[0-9]"));
  CHECK_THAT(ok_line(R"({"custom_id":"a","prompt":"x","structured_outputs":{"choice":["yes","no"]}})").params.grammar,
             Catch::Contains(R"("yes" | "no")"));
  CHECK_THAT(ok_line(R"({"custom_id":"a","prompt":"x","guided_choice":["up"]})").params.grammar, Catch::Contains(R"("up")"));
  CHECK_THAT(ok_line(R"({"custom_id":"a","prompt":"x","structured_outputs":{"grammar":"root ::= [a-z]+"}})").params.grammar,
             Catch::Contains("[a-z]+"));
  CHECK_THAT(ok_line(R"({"custom_id":"a","prompt":"x","structured_outputs":{"json":"{\"type\":\"integer\"}"}})").params.grammar,
             Catch::Contains("json_integer"));
  // Errors name the field and what to do.
  CHECK_THAT(error_of(chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"array","uniqueItems":true}}}}})"),
             Catch::Contains("'response_format': JSON schema at /: 'uniqueItems' is not supported"));
  CHECK_THAT(error_of(chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}}}})"),
             Catch::Contains("'response_format.json_schema.schema' is missing"));
  CHECK_THAT(error_of(chat + R"("response_format":{"type":"yaml"}}})"), Catch::Contains("'response_format.type' \"yaml\""));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","structured_outputs":{"regex":"a(b"}})"),
             Catch::Contains("'structured_outputs.regex': regex 'a(b'"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","structured_outputs":{"grammar":"root ::= item"}})"),
             Catch::Contains("'item', which is not defined"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","structured_outputs":{"regex":"a","choice":["b"]}})"),
             Catch::Contains("both constrain the output"));
  CHECK_THAT(error_of(chat + R"("response_format":{"type":"json_object"},"structured_outputs":{"regex":"a"}}})"),
             Catch::Contains("both constrain the output"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","structured_outputs":{"whitespace_pattern":" *","regex":"a"}})"),
             Catch::Contains("'structured_outputs.whitespace_pattern' is not supported"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","ignore_eos":true,"structured_outputs":{"regex":"a"}})"),
             Catch::Contains("'ignore_eos' cannot be combined with a structured output"));
  CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","min_tokens":2,"guided_regex":"a+"})"),
             Catch::Contains("'min_tokens' cannot be combined"));
  // The same schema on many lines is converted once; a bad one fails the same way every time.
  for (int k = 0; k < 3; ++k) {
    CHECK_THAT(error_of(R"({"custom_id":"a","prompt":"x","guided_json":{"type":"number","minimum":1}})"),
               Catch::Contains("'guided_json': JSON schema at /: 'minimum' on a number"));
  }
}

TEST_CASE("job defaults: merged under every line's body, the line's own fields winning", "[router][input][defaults]") {
  const auto d = BodyDefaults::parse(
      R"({"messages":[{"role":"system","content":"Answer in French."}],"max_tokens":5,"temperature":0.3,"top_k":7})",
      "job.toml:3:1: [defaults]");
  auto parse = [&](const std::string& line) {
    auto p = parse_batch_line(line, 16, &d);
    if (auto* e = std::get_if<LineError>(&p)) FAIL(e->message);
    return std::get<BatchRequest>(p);
  };
  // The defaults' messages first, then the line's; fields the line lacks come from the defaults.
  auto r = parse(R"({"custom_id":"a","url":"/v1/chat/completions","method":"POST","body":{"messages":[{"role":"user","content":"Hi"}],"temperature":0}})");
  REQUIRE(r.messages);
  REQUIRE(r.messages->size() == 2);
  CHECK((*r.messages)[0].role == "system");
  CHECK((*r.messages)[0].content == "Answer in French.");
  CHECK((*r.messages)[1].content == "Hi");
  CHECK(r.params.max_tokens == 5);
  CHECK(r.params.temperature == 0.0f);  // the line's
  CHECK(r.params.top_k == 7);
  // null removes a default; the short form merges the same way.
  r = parse(R"({"custom_id":"b","messages":[{"role":"user","content":"Hi"}],"top_k":null})");
  CHECK(r.params.top_k == 0);
  CHECK(r.messages->size() == 2);
  // A completions line cannot take messages: an error record that says the defaults are the cause.
  auto p = parse_batch_line(R"({"custom_id":"c","url":"/v1/completions","body":{"prompt":"x"}})", 16, &d);
  REQUIRE(std::holds_alternative<LineError>(p));
  CHECK_THAT(std::get<LineError>(p).message, Catch::Contains("messages") && Catch::Contains("job's defaults"));
  // Without messages in them, defaults serve completions too.
  const auto plain = BodyDefaults::parse(R"({"max_tokens":3,"stop":["\n"]})", "--defaults d.json");
  auto q = parse_batch_line(R"({"custom_id":"d","prompt":"x"})", 16, &plain);
  REQUIRE(std::holds_alternative<BatchRequest>(q));
  CHECK(std::get<BatchRequest>(q).params.max_tokens == 3);
  CHECK(plain.canonical() == R"({"max_tokens":3,"stop":["\n"]})");
}

TEST_CASE("bad job defaults stop the job with one line naming where they came from", "[router][input][defaults]") {
  auto why = [](const std::string& text) {
    try {
      (void)BodyDefaults::parse(text, "job.toml:3:1: [defaults]");
    } catch (const tandem::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(why("[1, 2]"), Catch::StartsWith("job.toml:3:1: [defaults]: the defaults must be an object"));
  CHECK_THAT(why("{\"custom_id\": \"x\"}"), Catch::Contains("'custom_id' cannot be a default"));
  CHECK_THAT(why("{\"prompt\": \"x\"}"), Catch::Contains("'prompt' cannot be a default"));
  CHECK_THAT(why("{\"temperature\": \"hot\"}"), Catch::Contains("'temperature' must be a number"));
  CHECK_THAT(why("{\"frobnicate\": 1}"), Catch::Contains("frobnicate"));
  CHECK(why("{\"echo\": true}") == "accepted");  // a completions field: chat lines will say so, line by line
}

TEST_CASE("embeddings lines: every input form, encoding_format and dimensions; other fields refused", "[router][input][embeddings]") {
  auto r = ok(R"({"custom_id":"a","url":"/v1/embeddings","method":"POST","body":{"input":"hi","model":"m","user":"u"}})");
  CHECK(r.endpoint == Endpoint::kEmbeddings);
  REQUIRE(r.input_texts);
  CHECK(*r.input_texts == std::vector<std::string>{"hi"});
  CHECK(r.model == "m");
  CHECK(!r.base64);
  r = ok(R"({"custom_id":"b","input":["x","y z"],"encoding_format":"base64","dimensions":8})");  // the short form
  CHECK(r.endpoint == Endpoint::kEmbeddings);
  CHECK(r.input_texts->size() == 2);
  CHECK(r.base64);
  CHECK(r.dimensions == 8);
  r = ok(R"({"custom_id":"c","input":[1,2,3]})");
  CHECK(r.input_ids == std::vector<std::vector<int32_t>>{{1, 2, 3}});
  r = ok(R"({"custom_id":"d","input":[[1,2],[3]]})");
  CHECK(r.input_ids == std::vector<std::vector<int32_t>>{{1, 2}, {3}});
  CHECK_THAT(error_of(R"({"custom_id":"e","input":""})"), Catch::Contains("'input' is an empty string"));
  CHECK_THAT(error_of(R"({"custom_id":"e","input":[]})"), Catch::Contains("'input' must be a non-empty string"));
  CHECK_THAT(error_of(R"({"custom_id":"e","input":["a", 3]})"), Catch::Contains("'input[1]' must be a non-empty string"));
  CHECK_THAT(error_of(R"({"custom_id":"e","input":[[1],[-2]]})"), Catch::Contains("'input[1]' must hold token ids"));
  CHECK_THAT(error_of(R"({"custom_id":"e","input":"a","encoding_format":"int8"})"), Catch::Contains("'encoding_format' must be"));
  CHECK_THAT(error_of(R"({"custom_id":"e","input":"a","dimensions":0})"), Catch::Contains("'dimensions'"));
  CHECK_THAT(error_of(R"({"custom_id":"e","input":"a","max_tokens":4})"),
             Catch::Contains("'max_tokens' is not an embeddings field"));
  std::string many = R"({"custom_id":"e","input":[)";
  for (int i = 0; i < 2049; ++i) many += (i ? ",[1]" : "[1]");
  CHECK_THAT(error_of(many + "]}"), Catch::Contains("at most 2048"));
}
