#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "router/embeddings.h"

using namespace tandem::router;
using tandem::runtime::Pooling;

namespace {

struct Dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("tandem-emb-" + std::to_string(::getpid()));
  Dir() { std::filesystem::create_directories(path / "1_Pooling"); }
  ~Dir() { std::filesystem::remove_all(path); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
};

const char* kModules = R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
  {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}%s])";

std::string modules(bool normalize, const std::string& extra = "") {
  std::string s = kModules;
  const std::string tail = std::string(normalize ? R"(,{"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"})" : "") + extra;
  return s.replace(s.find("%s"), 2, tail);
}

}  // namespace

TEST_CASE("pooling from sentence-transformers' configuration, or the decoder default", "[router][embeddings]") {
  Dir d;
  auto p = read_pooling(d.path.string());  // no modules.json: last token, normalised
  CHECK(p.pooling == Pooling::kLast);
  CHECK(p.normalize);
  d.write("modules.json", modules(true));
  d.write("1_Pooling/config.json", R"({"word_embedding_dimension":64,"pooling_mode_cls_token":false,"pooling_mode_mean_tokens":true,"pooling_mode_max_tokens":false,"pooling_mode_lasttoken":false})");
  p = read_pooling(d.path.string());
  CHECK(p.pooling == Pooling::kMean);
  CHECK(p.normalize);
  d.write("modules.json", modules(false));
  d.write("1_Pooling/config.json", R"({"pooling_mode_cls_token":true})");
  p = read_pooling(d.path.string());
  CHECK(p.pooling == Pooling::kCls);
  CHECK(!p.normalize);
  d.write("1_Pooling/config.json", R"({"pooling_mode_max_tokens":true})");
  CHECK_THROWS_WITH(read_pooling(d.path.string()), Catch::Contains("pooling_mode_max_tokens is not done"));
  CHECK(!pooling_or_error(d.path.string()).error.empty());  // kept for the embeddings lines, not thrown
  d.write("1_Pooling/config.json", R"({"pooling_mode_mean_tokens":true,"pooling_mode_lasttoken":true})");
  CHECK_THROWS_WITH(read_pooling(d.path.string()), Catch::Contains("2 pooling modes are on"));
  d.write("1_Pooling/config.json", R"({"pooling_mode_lasttoken":true})");
  d.write("modules.json", modules(true, R"(,{"idx":3,"name":"3","path":"3_Dense","type":"sentence_transformers.models.Dense"})"));
  CHECK_THROWS_WITH(read_pooling(d.path.string()), Catch::Contains("sentence_transformers.models.Dense"));
}

TEST_CASE("vectors normalised, truncated to dimensions and renormalised; base64 of float32 bytes", "[router][embeddings]") {
  const std::vector<float> v{3.0f, 4.0f, 12.0f};
  auto u = finish_embedding(v, true, 0);
  CHECK(u[0] == Approx(3.0 / 13));
  CHECK(u[2] == Approx(12.0 / 13));
  u = finish_embedding(v, true, 2);  // [3, 4] / 5 whatever the first normalisation
  REQUIRE(u.size() == 2);
  CHECK(u[0] == Approx(0.6));
  CHECK(u[1] == Approx(0.8));
  CHECK(finish_embedding(v, false, 0) == v);
  CHECK(finish_embedding(std::vector<float>{0.0f, 0.0f}, true, 0) == std::vector<float>{0.0f, 0.0f});  // no NaN
  // 1.0f = 00 00 80 3f; 2.0f = 00 00 00 40 (little-endian): "AACAPwAAAEA="
  CHECK(base64_floats(std::vector<float>{1.0f, 2.0f}) == "AACAPwAAAEA=");
  CHECK(base64_floats(std::vector<float>{1.0f}) == "AACAPw==");
}
