// Test tool: the CPU engine's logits for every position of a prompt, as a
// float32 .npy [T][vocab], for comparison with tests/reference/torch_forward.py.
// usage: engine_logits MODEL_DIR 1,2,3 OUT.npy [CHUNK [KV_DTYPE]]
//   CHUNK: prefill in chunks of this many tokens (default, or 0: all at once).
//   KV_DTYPE: f32 (default), bf16 or fp8, as kv.dtype.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "common/error.h"
#include "kv/block_pool.h"
#include "runtime/cpu/cpu_model.h"
#include "runtime/model/weights.h"

using namespace tandem;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: engine_logits MODEL_DIR 1,2,3 OUT.npy [CHUNK [KV_DTYPE]]\n");
    return 2;
  }
  try {
    const auto config = runtime::ModelConfig::load(argv[1]);
    const auto weights = runtime::ModelWeights::load(config, argv[1]);
    std::vector<int32_t> ids;
    std::stringstream ss(argv[2]);
    for (std::string item; std::getline(ss, item, ',');) ids.push_back(std::stoi(item));
    const int64_t T = static_cast<int64_t>(ids.size());
    const int64_t chunk = argc > 4 && std::stol(argv[4]) > 0 ? std::stol(argv[4]) : T;
    const std::string kv = argc > 5 ? argv[5] : "f32";
    kv::KvLayout layout{config.layers, config.kv_heads, config.head_dim, 16};
    layout.elem_bytes = kv == "fp8" ? 1 : kv == "bf16" ? 2 : 4;
    kv::BlockPool pool(layout, (T + 15) / 16);
    auto blocks = *pool.allocate((T + 15) / 16);
    runtime::cpu::ThreadPool threads;
    runtime::cpu::CpuModel model(config, *weights, pool, threads);
    std::vector<float> all, part;
    for (int64_t s = 0; s < T; s += chunk) {
      runtime::cpu::SeqChunk c;
      c.start_pos = s;
      c.tokens = std::span<const int32_t>(ids.data() + s, static_cast<std::size_t>(std::min(chunk, T - s)));
      c.block_table = blocks;
      c.logits_all = true;
      model.forward(std::span<const runtime::cpu::SeqChunk>(&c, 1), part);
      all.insert(all.end(), part.begin(), part.end());
    }
    // .npy version 1.0: magic, header length, a Python dict literal padded to 64 bytes.
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(T) + ", " +
                         std::to_string(config.vocab) + "), }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::ofstream out(argv[3], std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    const uint16_t hl = static_cast<uint16_t>(header.size());
    out.write(reinterpret_cast<const char*>(&hl), 2);
    out << header;
    out.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * sizeof(float)));
    std::printf("kernels: %s\n", model.kernels().name);
  } catch (const Error& e) {
    std::fprintf(stderr, "engine_logits: %s\n", e.what());
    return 2;
  }
  return 0;
}
