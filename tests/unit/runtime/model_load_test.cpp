#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/model/quantize.h"
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

TEST_CASE("mixtures of experts: which layers are sparse, how they route, and what is refused", "[model][moe]") {
  testing::TinyModel qwen("qwen3_moe", "f32"), mixtral("mixtral", "f32");
  const MoeConfig& q = qwen.config.moe;
  CHECK(q.experts == 8);
  CHECK(q.top_k == 2);
  CHECK(q.intermediate == 32);
  CHECK(q.norm_topk);
  CHECK_FALSE(q.at(0));  // mlp_only_layers: [0]
  CHECK(q.at(1));
  CHECK(qwen.weights->layers[0].experts.empty());
  CHECK(qwen.weights->layers[1].experts.size() == 8);
  CHECK(mixtral.config.moe.at(0));
  CHECK(mixtral.config.moe.intermediate == mixtral.config.intermediate);  // Mixtral's intermediate_size is its experts'
  CHECK(mixtral.config.sliding_window == 0);

  // Qwen3-MoE's decoder_sparse_step: every second layer sparse, layer 3 dense by name.
  nlohmann::json j = qwen.config.to_json();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  j.erase("norm_topk_prob");
  const auto stepped = ModelConfig::parse(j, "config.json");
  CHECK(stepped.moe.sparse == std::vector<bool>{false, true, false, false, false, true});
  CHECK_FALSE(stepped.moe.norm_topk);  // Hugging Face's default

  auto error = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = qwen.config.to_json();
    edit(c);
    try {
      ModelConfig::parse(c, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error([](auto& c) { c["shared_expert_intermediate_size"] = 2048; }),
             Catch::Contains("shared_expert_intermediate_size = 2048: shared experts") && Catch::Contains("not supported"));
  CHECK_THAT(error([](auto& c) { c["scoring_func"] = "sigmoid"; }), Catch::Contains("scoring_func = \"sigmoid\""));
  CHECK_THAT(error([](auto& c) { c["n_group"] = 8; }), Catch::Contains("n_group = 8: grouped top-k routing"));
  CHECK(error([](auto& c) { c["n_group"] = 1, c["scoring_func"] = "softmax"; }).empty());  // the plain values are fine
  CHECK_THAT(error([](auto& c) { c["num_experts_per_tok"] = 9; }), Catch::Contains("num_experts_per_tok (9) is more than the 8 experts"));
  CHECK_THAT(error([](auto& c) { c.erase("num_experts"); }), Catch::Contains("'num_experts' must be a positive integer (missing)"));
  CHECK_THAT(error([](auto& c) { c["mlp_only_layers"] = {5}; }), Catch::Contains("mlp_only_layers holds 5, not a layer of the 2"));

  // A config that does not match the checkpoint's experts is named by the tensor that shows it.
  edit_config(qwen.dir, [](auto& c) { c["num_experts"] = 9; });
  CHECK_THAT(load_error(qwen.dir),
             Catch::Contains("tensor 'model.layers.1.mlp.gate.weight' has shape [8, 64] but config.json implies [9, 64]"));
  edit_config(qwen.dir, [](auto& c) { c["num_experts"] = 8, c["moe_intermediate_size"] = 16; });
  CHECK_THAT(load_error(qwen.dir), Catch::Contains("tensor 'model.layers.1.mlp.experts.0.gate_proj.weight' has shape "
                                                   "[32, 64] but config.json implies [16, 64]"));
  edit_config(mixtral.dir, [](auto& c) { c["num_local_experts"] = 9; });
  CHECK_THAT(load_error(mixtral.dir), Catch::Contains("tensor 'model.layers.0.block_sparse_moe.gate.weight' has shape"));
}

namespace {

// A safetensors file of the given header entries over `data_bytes` bytes.
void write_raw(const fs::path& f, const nlohmann::json& header, std::size_t data_bytes) {
  const std::string h = header.dump();
  std::ofstream out(f, std::ios::binary);
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h << std::string(data_bytes, '\0');
}

std::string open_error(const fs::path& dir) {
  try {
    Checkpoint::open(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a safetensors file whose tensors overlap or leave holes is refused, as the format requires", "[model][errors]") {
  const fs::path d = fs::temp_directory_path() / ("tandem-st-" + std::to_string(::getpid()));
  fs::create_directories(d);
  auto tensor = [](uint64_t a, uint64_t b) {
    return nlohmann::json{{"dtype", "F32"}, {"shape", {(b - a) / 4}}, {"data_offsets", {a, b}}};
  };
  write_raw(d / "model.safetensors", {{"a", tensor(0, 16)}, {"b", tensor(16, 32)}}, 32);
  CHECK(open_error(d).empty());
  write_raw(d / "model.safetensors", {{"a", tensor(0, 16)}, {"b", tensor(8, 24)}}, 24);
  CHECK_THAT(open_error(d), Catch::Contains("tensors 'a' (bytes 0-16) and 'b' (bytes 8-24) overlap") &&
                                Catch::Contains("breaks the safetensors format"));
  write_raw(d / "model.safetensors", {{"a", tensor(0, 16)}, {"b", tensor(0, 16)}}, 16);  // one tensor's bytes twice
  CHECK_THAT(open_error(d), Catch::Contains("overlap"));
  write_raw(d / "model.safetensors", {{"a", tensor(0, 16)}, {"b", tensor(24, 40)}}, 40);
  CHECK_THAT(open_error(d), Catch::Contains("bytes 16-24 after the header belong to no tensor (before 'b')"));
  write_raw(d / "model.safetensors", {{"a", tensor(8, 24)}}, 24);
  CHECK_THAT(open_error(d), Catch::Contains("bytes 0-8 after the header belong to no tensor"));
  write_raw(d / "model.safetensors", {{"a", tensor(0, 16)}}, 20);
  CHECK_THAT(open_error(d), Catch::Contains("the 4 byte(s) after 'a' belong to no tensor"));
  write_raw(d / "model.safetensors", {{"a", {{"dtype", "F32"}, {"shape", "x"}, {"data_offsets", {0, 4}}}}}, 4);
  CHECK_THAT(open_error(d), Catch::Contains("tensor 'a' has no dtype, shape and data_offsets of the right types"));
  write_raw(d / "model.safetensors", {{"a", {{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}}}}, 4);
  CHECK_THAT(open_error(d), Catch::Contains("impossible shape"));
  fs::remove_all(d);
}

TEST_CASE("FP8 E4M3: every code decodes as the format defines it, and encoding rounds to the nearest, ties to even",
          "[model][quant]") {
  // Decode: sign, exponent bias 7, subnormals at exponent 0, 0x7F / 0xFF NaN, largest 448.
  CHECK(f8e4m3_to_f32(0x00) == 0.0f);
  CHECK(std::signbit(f8e4m3_to_f32(0x80)));
  CHECK(f8e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));  // the smallest subnormal
  CHECK(f8e4m3_to_f32(0x08) == std::ldexp(1.0f, -6));  // the smallest normal
  CHECK(f8e4m3_to_f32(0x38) == 1.0f);
  CHECK(f8e4m3_to_f32(0x7E) == 448.0f);
  CHECK(f8e4m3_to_f32(0xFE) == -448.0f);
  CHECK(std::isnan(f8e4m3_to_f32(0x7F)));
  CHECK(std::isnan(f8e4m3_to_f32(0xFF)));
  // Every finite code survives a round trip; midpoints between neighbours go to the even code.
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    const float v = f8e4m3_to_f32(static_cast<uint8_t>(b));
    INFO("code " << b);
    CHECK(f32_to_f8e4m3(v) == (b == 0x80 ? 0x80 : b));
    if ((b & 0x7F) < 0x7E) {
      const float next = f8e4m3_to_f32(static_cast<uint8_t>(b + 1));
      const float mid = (v + next) / 2;  // exact in f32
      CHECK(f32_to_f8e4m3(mid) == ((b & 1) == 0 ? b : b + 1));
      CHECK(f32_to_f8e4m3(std::nextafter(mid, v)) == b);
      CHECK(f32_to_f8e4m3(std::nextafter(mid, next)) == b + 1);
    }
  }
  CHECK(f32_to_f8e4m3(1e6f) == 0x7E);  // saturates
  CHECK(f32_to_f8e4m3(-500.0f) == 0xFE);
  CHECK(f32_to_f8e4m3(std::ldexp(1.0f, -11)) == 0x00);  // below half the smallest subnormal
  // The statement in libm's terms (f32_to_f8e4m3 works on the bits; all 2^32 floats agreed when it was written):
  // every 257th float's bit pattern, and every 7th of the binades around the subnormal codes and the first normal
  // ones (the ties and their neighbours are above).
  const auto statement = [](float f) -> uint8_t {
    if (std::isnan(f)) return 0x7F;
    const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
    const float a = std::fabs(f);
    if (a >= 448.0f) return sign | 0x7E;
    int e;
    std::frexp(a, &e);  // a in [2^(e-1), 2^e): E4M3's step there 2^(e-4), below 2^-6 the subnormals' 2^-9
    const int step = std::max(e - 1, -6) - 3;
    const float v = std::ldexp(std::nearbyint(std::ldexp(a, -step)), step);  // ties to even
    if (v >= 448.0f) return sign | 0x7E;
    if (v < std::ldexp(1.0f, -6)) return sign | static_cast<uint8_t>(std::ldexp(v, 9));
    int ve;
    const float vm = std::frexp(v, &ve);
    return sign | static_cast<uint8_t>((ve + 6) << 3) | static_cast<uint8_t>(std::ldexp(vm, 4) - 8);
  };
  int64_t differ = 0;
  auto check = [&](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    differ += f32_to_f8e4m3(f) != statement(f);
  };
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 257) check(static_cast<uint32_t>(b));
  for (uint32_t b = 0x3A000000u; b < 0x3D000000u; b += 7) {  // 2^-11 to 2^-5, both signs
    check(b);
    check(b | 0x80000000u);
  }
  CHECK(differ == 0);
}

TEST_CASE("quantized checkpoints: quantize, reload, and every unsupported scheme refused with one line",
          "[model][quant][errors]") {
  testing::TinyModel tiny("qwen3", "bf16");
  const fs::path fp8 = tiny.dir.string() + "-fp8", int8 = tiny.dir.string() + "-int8";
  std::vector<TensorQuantError> seen;
  const auto s = quantize_checkpoint({tiny.dir, fp8, "fp8-block"}, [&](const TensorQuantError& e) { seen.push_back(e); });
  CHECK(s.quantized == 14);  // 2 layers x (q, k, v, o, gate, up, down)
  CHECK(static_cast<int64_t>(seen.size()) == s.quantized);
  for (const auto& e : seen) {
    INFO(e.name);
    CHECK(quantizable_weight(e.name));
    CHECK(e.rms_rel > 0);
    CHECK(e.max_rel < 0.0625);  // half an e4m3 step (2^-4) of the block's largest value at most
  }
  quantize_checkpoint({tiny.dir, int8, "int8-channel"});

  // They load and stay 8-bit (codes in the mapping, scales beside them); their values are code x scale.
  for (const fs::path& d : {fp8, int8}) {
    auto c = ModelConfig::load(d);
    REQUIRE(c.quant.any());
    for (const bool panels : {false, true}) {
      auto w = ModelWeights::load(c, d, panels);
      const Matrix& q = w->layers[0].w_gate;  // [128, 64]
      CHECK(q.dtype == (d == fp8 ? DType::kF8E4M3 : DType::kI8));
      CHECK(q.panels == panels);
      const auto orig = ModelWeights::load(tiny.config, tiny.dir, false);
      const Matrix& o = orig->layers[0].w_gate;
      double err = 0, mag = 0;
      for (int64_t n = 0; n < q.rows; ++n) {
        for (int64_t k = 0; k < q.cols; ++k) {
          const auto code = static_cast<const uint8_t*>(q.data)[q.index(n, k)];
          const float v = d == fp8 ? f8e4m3_to_f32(code) : static_cast<float>(static_cast<int8_t>(code));
          REQUIRE(q.at(n, k) == v * q.scales.at(n, k));
          err = std::max(err, static_cast<double>(std::fabs(q.at(n, k) - o.at(n, k))));
          mag = std::max(mag, static_cast<double>(std::fabs(o.at(n, k))));
        }
      }
      CHECK(err > 0);
      CHECK(err < 0.07 * mag);
      // A shard of rows, as a tensor-parallel rank takes it: the same values.
      const Matrix half = q.row_view(64, 128);
      CHECK(half.at(3, 5) == q.at(67, 5));
    }
  }

  CHECK_THROWS_WITH(quantize_checkpoint({fp8, tiny.dir.string() + "-again", "fp8-block"}),
                    Catch::Contains("already quantized (fp8 128x128 block)"));
  CHECK_THROWS_WITH(quantize_checkpoint({tiny.dir, fp8, "fp8-block"}), Catch::Contains("is not an empty directory"));
  CHECK_THROWS_WITH(quantize_checkpoint({tiny.dir, tiny.dir.string() + "-x", "nf4"}), Catch::Contains("--scheme must be"));

  const std::string original = [&] {
    std::ifstream in(fp8 / "config.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto restore = [&] { std::ofstream(fp8 / "config.json") << original; };
  edit_config(fp8, [](auto& j) { j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}}; });
  CHECK_THAT(load_error(fp8), Catch::Contains("quant_method \"awq\" is not supported"));
  edit_config(fp8, [](auto& j) { j["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "static"}}; });
  CHECK_THAT(load_error(fp8), Catch::Contains("without weight_block_size (per-tensor FP8) is not supported"));
  edit_config(fp8, [](auto& j) { j["quantization_config"]["fmt"] = "e5m2"; });
  CHECK_THAT(load_error(fp8), Catch::Contains("fmt \"e5m2\" is not supported"));
  restore();
  edit_config(fp8, [](auto& j) { j["quantization_config"]["some_new_knob"] = true; });
  CHECK_THAT(load_error(fp8), Catch::Contains("quantization_config.some_new_knob is not a setting Tandem reads"));
  restore();
  edit_config(fp8, [](auto& j) { j.erase("quantization_config"); });
  CHECK_THAT(load_error(fp8), Catch::Contains("is F8_E4M3 but config.json has no quantization_config"));
  restore();
  edit_config(fp8, [](auto& j) { j["quantization_config"]["weight_block_size"] = {64, 64}; });
  CHECK_THAT(load_error(fp8), Catch::Contains("weight_scale_inv' has shape [1, 1]") && Catch::Contains("are [2, 1]"));
  restore();

  const std::string original8 = [&] {
    std::ifstream in(int8 / "config.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  edit_config(int8, [](auto& j) { j["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 4; });
  CHECK_THAT(load_error(int8), Catch::Contains("weights.num_bits 4 is not supported"));
  std::ofstream(int8 / "config.json") << original8;
  edit_config(int8, [](auto& j) { j["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 128; });
  CHECK_THAT(load_error(int8), Catch::Contains("group_size (grouped weights) is not supported"));
  std::ofstream(int8 / "config.json") << original8;
  edit_config(int8, [](auto& j) { j["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = false; });
  CHECK_THAT(load_error(int8), Catch::Contains("symmetric false (zero points) is not supported"));
  std::ofstream(int8 / "config.json") << original8;
  edit_config(int8, [](auto& j) { j["quantization_config"]["kv_cache_scheme"] = {{"num_bits", 8}}; });
  CHECK_THAT(load_error(int8), Catch::Contains("kv_cache_scheme (a quantized KV cache) is not supported"));
  std::ofstream(int8 / "config.json") << original8;
  CHECK_NOTHROW(ModelWeights::load(ModelConfig::load(int8), int8));
  fs::remove_all(fp8);
  fs::remove_all(int8);
}
