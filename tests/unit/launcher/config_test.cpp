#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "launcher/config/load.h"
#include "launcher/config/schema.h"

using namespace tandem::launcher;

namespace {

// The one-line message a config problem produces.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "job.toml", overrides);
  } catch (const tandem::Error& e) {
    std::string msg = e.what();
    REQUIRE(msg.find('\n') == std::string::npos);
    return msg;
  }
  FAIL("expected a config error for: " << text);
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("an empty config gives the documented defaults", "[config]") {
  Config c = parse_config("", "job.toml");
  CHECK(c.job.mode == "disagg");
  CHECK(c.kv.block_size == 16);
  CHECK(c.http.host == "127.0.0.1");
  CHECK(c.http.port == 8000);
  CHECK(c.log.level == "info");
  CHECK(c.router.overlap_weight_host == 0.75);
}

TEST_CASE("a full config is read into the typed sections", "[config]") {
  Config c = parse_config(R"(
[model]
path = "/scratch/models/qwen3"
[job]
mode = "agg"
max_num_seqs = 128
drain_seconds = 90      # an integer is fine where a number is expected
resume = false
[cluster]
prefill_fraction = 0.25
[planner]
policy = "static:2:6"
[kv]
block_size = 32
memory_gib = 12.5
)",
                          "job.toml");
  CHECK(c.model.path == "/scratch/models/qwen3");
  CHECK(c.job.mode == "agg");
  CHECK(c.job.max_num_seqs == 128);
  CHECK(c.job.drain_seconds == 90.0);
  CHECK_FALSE(c.job.resume);
  CHECK(c.cluster.prefill_fraction == 0.25);
  CHECK(c.planner.policy == "static:2:6");
  CHECK(c.kv.block_size == 32);
  CHECK(c.kv.memory_gib == 12.5);
}

TEST_CASE("a typo'd key names file, line, column and the near miss", "[config]") {
  CHECK(error_of("[kv]\nblock_size = 16\nblok_size = 32\n") ==
        "job.toml:3:1: unknown key 'blok_size' in [kv]; did you mean 'block_size'?");
  CHECK(error_of("[kvv]\nblock_size = 16\n") == "job.toml:1:2: unknown section [kvv]; did you mean [kv]?");
  CHECK_THAT(error_of("[job]\nwhatever = 1\n"),
             Catch::StartsWith("job.toml:2:1: unknown key 'whatever' in [job]; see docs/config.md"));
}

TEST_CASE("a string where a number belongs is a type error with an example", "[config]") {
  CHECK(error_of("[kv]\nblock_size = \"16\"\n") ==
        "job.toml:2:14: kv.block_size must be an integer, got the string \"16\" (e.g. block_size = 16)");
  CHECK(error_of("[job]\nresume = 1\n") ==
        "job.toml:2:10: job.resume must be a boolean (true or false), got the integer 1 (e.g. resume = false)");
  CHECK(error_of("[kv]\nblock_size = 16.0\n") ==
        "job.toml:2:14: kv.block_size must be an integer, got the number 16 (e.g. block_size = 16)");
  CHECK_THAT(error_of("kv = 3\n"), Catch::StartsWith("job.toml:1:1: 'kv' must be a section ([kv])"));
}

TEST_CASE("a negative size or out-of-range value names the bound", "[config]") {
  CHECK(error_of("[kv]\nmemory_gib = -4\n") == "job.toml:2:14: kv.memory_gib must be at least 0.0, got -4.0");
  CHECK(error_of("[kv]\nblock_size = -16\n") == "job.toml:2:14: kv.block_size must be between 1 and 1024, got -16");
  CHECK(error_of("[http]\nport = 70000\n") == "job.toml:2:8: http.port must be between 1 and 65535, got 70000");
  CHECK(error_of("[cluster]\nprefill_fraction = 1.5\n") ==
        "job.toml:2:20: cluster.prefill_fraction must be between 0.0 and 1.0, got 1.5");
}

TEST_CASE("choices and structured strings are checked", "[config]") {
  CHECK(error_of("[job]\nmode = \"disag\"\n") ==
        "job.toml:2:8: job.mode must be one of \"disagg\", \"agg\", \"auto\", got \"disag\"; did you mean \"disagg\"?");
  CHECK(error_of("[planner]\npolicy = \"static:0:4\"\n") ==
        "job.toml:2:10: planner.policy must be static:P:D with positive rank counts, e.g. \"static:2:6\", got "
        "\"static:0:4\"");
  CHECK_THAT(error_of("[planner]\npolicy = \"fastest\"\n"), Catch::Contains("must be one of \"lookahead\""));
}

TEST_CASE("TOML syntax errors carry their position", "[config]") {
  CHECK_THAT(error_of("[kv]\nblock_size = = 3\n"), Catch::StartsWith("job.toml:2:") &&
                                                      Catch::Contains("TOML syntax error"));
}

TEST_CASE("overrides (--set) apply after the file, typed and validated", "[config]") {
  Config c = parse_config("[kv]\nblock_size = 16\n", "job.toml",
                          {"kv.block_size=64", "model.path=/data/my model", "job.resume=false",
                           "model.served_name=\"qwen\"", "job.drain_seconds=5"});
  CHECK(c.kv.block_size == 64);
  CHECK(c.model.path == "/data/my model");
  CHECK_FALSE(c.job.resume);
  CHECK(c.model.served_name == "qwen");
  CHECK(c.job.drain_seconds == 5.0);

  CHECK(error_of("", {"kv.block_size=abc"}) == "--set kv.block_size=abc: kv.block_size must be an integer, got \"abc\"");
  CHECK(error_of("", {"kv.blocksize=3"}) ==
        "--set kv.blocksize=3: unknown key 'blocksize' in [kv]; did you mean 'block_size'?");
  CHECK(error_of("", {"kv.block_size=0"}) == "--set kv.block_size=0: kv.block_size must be between 1 and 1024, got 0");
  CHECK_THAT(error_of("", {"block_size=3"}), Catch::Contains("expected section.key=value"));
}

TEST_CASE("a missing file is one clear line", "[config]") {
  try {
    load_config("/nonexistent/job.toml");
    FAIL("no error");
  } catch (const tandem::Error& e) {
    CHECK(std::string(e.what()) == "/nonexistent/job.toml: cannot read the config file; check the path given to -c");
  }
}

TEST_CASE("the effective config round-trips through TOML", "[config]") {
  Config c = parse_config("[job]\nmode = \"agg\"\n[kv]\nmemory_gib = 3.5\n", "job.toml");
  Config again = parse_config(to_toml(c), "effective.toml");
  CHECK(to_toml(again) == to_toml(c));
  CHECK(again.job.mode == "agg");
  CHECK(again.kv.memory_gib == 3.5);
}

TEST_CASE("every schema default passes its own validation", "[config]") {
  const Config defaults;
  for (const auto& spec : schema()) {
    INFO(spec.full_name());
    CHECK(check_value(spec, spec.get(defaults)).empty());
    CHECK_FALSE(spec.doc.empty());
  }
}

TEST_CASE("docs/config.md is the generated reference", "[config]") {
  // Regenerate with: build/launcher/tandem config --reference > docs/config.md
  CHECK(read_file(TANDEM_SOURCE_DIR "/docs/config.md") == reference_markdown());
}

TEST_CASE("the example job files load cleanly", "[config]") {
  for (const char* name : {"/jobs/example.toml"}) {
    INFO(name);
    CHECK_NOTHROW(load_config(std::string(TANDEM_SOURCE_DIR) + name));
  }
}

TEST_CASE("model.dtype takes the dtypes it converts to and refuses any other", "[config]") {
  for (const char* d : {"auto", "f32", "bf16", "f16", "fp8", "int8"}) {
    INFO(d);
    CHECK_NOTHROW(parse_config(std::string("[model]\ndtype = \"") + d + "\"\n", "job.toml", {}));
  }
  CHECK_THAT(error_of("[model]\ndtype = \"fp4\"\n"), Catch::Contains("model.dtype") && Catch::Contains("fp4"));
}

TEST_CASE("[defaults] is kept as the JSON of its table, nested tables and arrays included", "[config][defaults]") {
  const Config c = parse_config(
      "[defaults]\nmax_tokens = 8\ntemperature = 0.5\nstop = [\"\\n\"]\n"
      "[[defaults.messages]]\nrole = \"system\"\ncontent = \"Be brief.\"\n"
      "[defaults.response_format]\ntype = \"json_object\"\n",
      "job.toml");
  const auto j = nlohmann::json::parse(c.defaults);
  CHECK(j["max_tokens"] == 8);
  CHECK(j["temperature"] == 0.5);
  CHECK(j["stop"] == nlohmann::json::array({"\n"}));
  CHECK(j["messages"][0]["content"] == "Be brief.");
  CHECK(j["response_format"]["type"] == "json_object");
  CHECK(c.defaults_source == "job.toml:1:2: [defaults]");
  CHECK_THAT(error_of("defaults = 3\n"), Catch::StartsWith("job.toml:1:1: 'defaults' must be a section ([defaults])"));
  CHECK(parse_config("", "job.toml").defaults.empty());
}
