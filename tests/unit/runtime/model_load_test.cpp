#include <catch2/catch.hpp>

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "test_model.h"

using namespace tandem;
using namespace tandem::runtime;
namespace fs = std::filesystem;

namespace {

std::string load_error(const fs::path& dir) {
  try {
    auto c = ModelConfig::load(dir);
    ModelWeights::load(c, dir);
  } catch (const Error& e) {
    std::string msg = e.what();
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  }
  FAIL("expected an error loading " << dir);
  return "";
}

void edit_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& f) {
  nlohmann::json j;
  std::ifstream(dir / "config.json") >> j;
  f(j);
  std::ofstream(dir / "config.json") << j.dump();
}

}  // namespace

TEST_CASE("a bad model directory stops with one line naming the file and the problem", "[model][errors]") {
  testing::TinyModel tiny;
  const fs::path d = tiny.dir;
  const std::string original_config = [&] {
    std::ifstream in(d / "config.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto restore = [&] { std::ofstream(d / "config.json") << original_config; };

  CHECK_THAT(load_error(d / "nope"), Catch::Contains("config.json: cannot read the model config (no such directory)"));
  // A file given as the model: it is not a directory (not "config.json missing").
  CHECK_THAT(load_error(d / "config.json"), Catch::Contains("config.json: is a file, not a model directory"));

  edit_config(d, [](auto& j) { j["architectures"] = {"GPT2LMHeadModel"}; });
  CHECK_THAT(load_error(d), Catch::Contains("architecture 'GPT2LMHeadModel' is not supported"));
  restore();

  edit_config(d, [](auto& j) { j["torch_dtype"] = "float8_e4m3fn"; });
  CHECK_THAT(load_error(d), Catch::Contains("torch_dtype 'float8_e4m3fn' is not supported"));
  restore();

  edit_config(d, [](auto& j) { j["intermediate_size"] = 100; });
  CHECK_THAT(load_error(d), Catch::Contains("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [128, 64] but "
                                            "config.json implies [100, 64]"));
  restore();

  edit_config(d, [](auto& j) { j["num_hidden_layers"] = 3; });
  CHECK_THAT(load_error(d), Catch::Contains("tensor 'model.layers.2.input_layernorm.weight' is missing"));
  restore();

  // A truncated file.
  const auto size = fs::file_size(d / "model.safetensors");
  fs::resize_file(d / "model.safetensors", size - 1000);
  CHECK_THAT(load_error(d), Catch::Contains("model.safetensors: tensor '") && Catch::Contains("truncated shard"));
  fs::remove(d / "model.safetensors");
  CHECK_THAT(load_error(d), Catch::Contains("no model.safetensors or model.safetensors.index.json"));
}
