#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/utf8.h"
#include "tokenizer_files.h"

using tandem::runtime::StreamDecoder;
using tandem::runtime::Tokenizer;
using tandem::testing::tokenizer_dir;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> corpus() {
  std::ifstream in(TANDEM_SOURCE_DIR "/tests/data/tokenizer_corpus.jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line).get<std::string>());
  REQUIRE(lines.size() >= 300);
  return lines;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh temporary model directory.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tandem-tok-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
};

std::string load_error(const fs::path& dir) {
  try {
    Tokenizer::load(dir);
  } catch (const tandem::Error& e) {
    std::string msg = e.what();
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  }
  FAIL("expected a load error for " << dir);
  return "";
}

}  // namespace

TEST_CASE("Qwen3 encodes the reference sentence as Hugging Face does", "[tokenizer]") {
  auto tok = Tokenizer::load(tokenizer_dir("qwen3"));
  CHECK(tok->encode("Hello, world! 123 héllo 你好", false) ==
        std::vector<int32_t>{9707, 11, 1879, 0, 220, 16, 17, 18, 305, 18503, 385, 220, 108386});
  CHECK(tok->encode("<|im_start|>user", false) == std::vector<int32_t>{151644, 872});
  CHECK(tok->is_special(151644));
  CHECK_FALSE(tok->is_special(tok->token_to_id("<think>")));
  CHECK(tok->eos_id() == 151645);
}

TEST_CASE("Mistral's SentencePiece BPE adds BOS and falls back to bytes", "[tokenizer]") {
  auto tok = Tokenizer::load(tokenizer_dir("llama2"));
  const auto ids = tok->encode("Hello", true);
  REQUIRE(ids.size() >= 2);
  CHECK(ids.front() == 1);  // <s>
  CHECK(tok->decode(ids, true) == "Hello");
  const auto cjk = tok->encode("\xF0\xA0\x80\x80", false);  // U+20000 is not in the vocabulary: 4 byte tokens
  CHECK(cjk.size() == 5);
  CHECK(tok->decode(cjk, false) == "\xF0\xA0\x80\x80");
}

TEST_CASE("streaming decode never splits a character and adds up to the full decode", "[tokenizer]") {
  const auto lines = corpus();
  for (const char* name : {"qwen3", "llama3", "llama2"}) {
    auto tok = Tokenizer::load(tokenizer_dir(name));
    for (bool skip : {false, true}) {
      std::size_t checked = 0;
      for (const auto& s : lines) {
        if (s.size() > 4096) continue;  // the long lines add time, not cases
        const auto ids = tok->encode(s, true);
        StreamDecoder stream(*tok, skip);
        std::string joined;
        for (int32_t id : ids) {
          const std::string chunk = stream.push(id);
          INFO(name << " text: " << s << " chunk: " << chunk);
          REQUIRE(tandem::runtime::is_valid_utf8(chunk));
          joined += chunk;
        }
        joined += stream.finish();
        INFO(name << " skip_special=" << skip << " text: " << s);
        REQUIRE(joined == tok->decode(ids, skip));
        ++checked;
      }
      CHECK(checked > 300);
    }
  }
}

TEST_CASE("a multi-byte character split over byte tokens is held back until complete", "[tokenizer]") {
  auto tok = Tokenizer::load(tokenizer_dir("llama2"));
  // "𠀀" is four <0xNN> tokens in Mistral's vocabulary.
  auto ids = tok->encode("\xF0\xA0\x80\x80!", false);
  StreamDecoder stream(*tok, false);
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(stream.push(id));
  chunks.push_back(stream.finish());
  std::string joined;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].find("\xF0\xA0\x80\x80") != std::string::npos) CHECK(i >= 4);  // only once all 4 bytes are in
    joined += chunks[i];
  }
  CHECK(joined == tok->decode(ids, false));
}

TEST_CASE("bad tokenizer files fail with one line naming the file and the part", "[tokenizer]") {
  TempDir dir;
  CHECK_THAT(load_error(dir.path / "nope"), Catch::Contains("not a directory"));
  CHECK_THAT(load_error(dir.path), Catch::Contains("tokenizer.json: cannot read the tokenizer (missing"));

  const std::string good = read_file(tokenizer_dir("qwen3") / "tokenizer.json");
  dir.write("tokenizer.json", good.substr(0, good.size() / 2));
  CHECK_THAT(load_error(dir.path), Catch::Contains("tokenizer.json: not valid JSON at byte"));

  auto doc = nlohmann::json::parse(good);
  doc["model"]["type"] = "WordPiece";
  dir.write("tokenizer.json", doc.dump());
  CHECK_THAT(load_error(dir.path), Catch::Contains("tokenizer.json: model type 'WordPiece' is not supported"));

  doc = nlohmann::json::parse(good);
  doc["pre_tokenizer"] = {{"type", "Whitespace"}};
  dir.write("tokenizer.json", doc.dump());
  CHECK_THAT(load_error(dir.path), Catch::Contains("tokenizer.json: pre_tokenizer type 'Whitespace' is not supported"));

  doc = nlohmann::json::parse(good);
  doc["normalizer"] = {{"type", "BertNormalizer"}};
  dir.write("tokenizer.json", doc.dump());
  CHECK_THAT(load_error(dir.path), Catch::Contains("normalizer type 'BertNormalizer' is not supported"));

  doc = nlohmann::json::parse(good);
  doc["model"].erase("merges");
  dir.write("tokenizer.json", doc.dump());
  CHECK_THAT(load_error(dir.path), Catch::Contains("tokenizer.json: unexpected structure"));

  dir.write("tokenizer.json", good);
  dir.write("tokenizer_config.json", "{\"chat_template\": ");
  CHECK_THAT(load_error(dir.path), Catch::Contains("tokenizer_config.json: not valid JSON"));
}

TEST_CASE("token_bytes: what each token adds to the text, as a grammar reads it", "[tokenizer]") {
  for (const char* name : {"qwen3", "llama3", "llama2"}) {
    INFO(name);
    auto tok = Tokenizer::load(tokenizer_dir(name));
    for (const std::string& line : corpus()) {
      // After the first token the decoder's first-token rules (Metaspace, Strip) no longer apply.
      const auto ids = tok->encode("x" + line, false);
      REQUIRE(!ids.empty());
      std::string joined;
      for (std::size_t k = 1; k < ids.size(); ++k) joined += tok->token_bytes(ids[k]);
      if (!tandem::runtime::is_valid_utf8(joined)) continue;  // decode() would replace the broken bytes
      const std::string first = tok->decode(std::vector<int32_t>{ids[0]}, true), all = tok->decode(ids, true);
      REQUIRE(all.starts_with(first));
      REQUIRE(joined == all.substr(first.size()));  // special tokens spell nothing
    }
    const int32_t eos = *tok->eos_id();
    CHECK(tok->token_bytes(eos).empty());  // special: never read by a grammar
    CHECK(tok->token_bytes(-1).empty());
  }
  auto llama2 = Tokenizer::load(tokenizer_dir("llama2"));
  CHECK(llama2->token_bytes(llama2->token_to_id("<0x41>")) == "A");
  CHECK(llama2->token_bytes(llama2->token_to_id("\xE2\x96\x81the")) == " the");
}
