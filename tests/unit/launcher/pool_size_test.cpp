#include <catch2/catch.hpp>

#include <exception>
#include <string>

#include "launcher/run/job_checks.h"
#include "topology/cells.h"

using tandem::topology::cell_pool_bytes;
using tandem::launcher::device_pool_room;
using tandem::launcher::kv_layout;
using tandem::launcher::Prepared;

namespace {

// A Llama-3-8B shape on a GPU backend, bf16 weights (16 GB) on an 80 GB device.
Prepared eight_b() {
  Prepared p;
  p.model.hidden = 4096, p.model.intermediate = 14336, p.model.layers = 32, p.model.heads = 32;
  p.model.kv_heads = 8, p.model.head_dim = 128, p.model.vocab = 128256;
  p.cfg.model.backend = "cuda";
  p.cfg.choices.backend = tandem::launcher::ComputeBackend::kCuda;
  p.max_model_len = 8192;
  return p;
}

}  // namespace

TEST_CASE("a GPU rank's pool room grows with its group's width: it holds a smaller shard of the weights", "[pool]") {
  const Prepared p = eight_b();
  const double weights = 16e9, free = 80e9;
  const double one = device_pool_room(p, weights, free, 1), two = device_pool_room(p, weights, free, 2);
  CHECK(one > 0);
  CHECK(one < free - weights);
  CHECK(two > one);
  // The embedding and LM head stay whole: a rank of 2 saves less than half the weights.
  const double replicated = 2.0 * 128256 * 4096 * 2;
  CHECK(two - one == Approx(0.9 * (weights - replicated) / 2).epsilon(0.02));
  CHECK(device_pool_room(p, weights, 10e9, 1) == 0);  // the weights alone do not fit: no room, not a negative one
}

TEST_CASE("a cell's pool fits both forms' room and holds no more than the larger want", "[pool]") {
  const Prepared p = eight_b();
  const uint64_t b1 = kv_layout(p, 1).block_bytes(), b2 = kv_layout(p, 2).block_bytes();
  CHECK(b1 == 2 * b2);  // tp 2 holds half the KV heads
  const double room1 = device_pool_room(p, 16e9, 80e9, 1), room2 = device_pool_room(p, 16e9, 80e9, 2);
  // Wanting more than either room: the narrower form's room binds (its shard is the larger).
  const uint64_t big = cell_pool_bytes(1e12, room1, 1e12 / 2, room2, b1, b2);
  CHECK(static_cast<double>(big) == Approx(room1));
  // Wanting little: the larger want, whole.
  CHECK(cell_pool_bytes(4e9, room1, 2e9, room2, b1, b2) == 4000000000u);
  CHECK(cell_pool_bytes(2e9, room1, 4e9, room2, b1, b2) == 4000000000u);
  // No room at all still leaves a block of either form, as pool_blocks never gives none.
  CHECK(cell_pool_bytes(4e9, 0, 2e9, 0, b1, b2) == b1);
}

TEST_CASE("kv.dtype = fp8: rows of head_dim codes and a scale, on the CPU and on a GPU", "[pool]") {
  Prepared p = eight_b();
  p.cfg.kv.dtype = "fp8";
  // On a GPU as on the CPU: whatever else stops this check here (no GPU visible), not the KV dtype.
  try {
    tandem::launcher::check_backend(p, 2);
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find("kv.dtype") == std::string::npos);
  }
  CHECK(kv_layout(p, 1).elem_bytes == 1);
  p.model.head_dim = 126;  // a row's scale would not be an aligned float: refused on a GPU too, before anything else
  CHECK_THROWS_WITH(tandem::launcher::check_backend(p, 2), Catch::Contains("multiple of 4"));
  p.model.head_dim = 128;
  p.cfg.model.backend = "cpu";
  p.cfg.choices.backend = tandem::launcher::ComputeBackend::kCpu;
  const auto l = kv_layout(p, 1);
  CHECK(l.elem_bytes == 1);
  CHECK(l.block_bytes() == 32u * 2 * 8 * 16 * (128 + 4));
  CHECK(l.bytes_per_value() == Approx(1.03125));
  p.model.head_dim = 126;  // a row's scale would not be an aligned float
  CHECK_THROWS_WITH(tandem::launcher::check_backend(p, 2), Catch::Contains("multiple of 4"));
}

TEST_CASE("kv.dtype = auto: bf16 on a GPU for a bf16 checkpoint and on the CPU under bf16-amx, else f32", "[pool]") {
  Prepared p = eight_b();  // bf16 weights on a GPU
  p.model.dtype = tandem::runtime::DType::kBF16;
  CHECK(kv_layout(p, 1).elem_bytes == 2);
  p.model.dtype = tandem::runtime::DType::kF32;
  CHECK(kv_layout(p, 1).elem_bytes == 4);
  p.model.dtype = tandem::runtime::DType::kBF16;
  p.cfg.model.backend = "cpu";
  p.cfg.choices.backend = tandem::launcher::ComputeBackend::kCpu;
  for (const char* products : {"f32", "bf16", "int8"}) {
    p.cfg.model.cpu_matmul = products;
    CHECK(kv_layout(p, 1).elem_bytes == 4);  // the reference's float32 KV
  }
  // bf16-amx's attention reads each KV element rounded to bf16: the pool holds them so, the same bits in half
  // the memory (test_vs_torch.py holds the logits bitwise equal)
  p.cfg.model.cpu_matmul = "bf16-amx";
  CHECK(kv_layout(p, 1).elem_bytes == 2);
  CHECK(kv_layout(p, 2).block_bytes() * 2 == kv_layout(p, 1).block_bytes());
  p.model.head_dim = 127;  // bf16 KV pairs elements in a float: an odd head_dim stays f32
  CHECK(kv_layout(p, 1).elem_bytes == 4);
  p.model.head_dim = 128;
  p.cfg.kv.dtype = "f32";  // asked for: kept
  CHECK(kv_layout(p, 1).elem_bytes == 4);
}
