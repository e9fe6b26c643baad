// kBf16Amx's arithmetic (kernels.h) written out here, from the rule alone, and the tables this CPU has, for the
// tests that hold the tables to it (bf16amx_kernels_test, bf16amx_attention_test).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu::test {

inline float ftz(float v) { return std::fabs(v) < 0x1p-126f && v != 0.0f ? std::copysign(0.0f, v) : v; }

// A float as an AMX operand: bf16 nearest even (NaN kept), a subnormal read as a zero of its sign.
inline float operand(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7FFFFFFFu) <= 0x7F800000u)
    bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  else
    bits = (bits | 0x00400000u) & 0xFFFF0000u;
  float b;
  std::memcpy(&b, &bits, 4);
  return ftz(ftz(v) == 0.0f ? std::copysign(0.0f, v) : b);
}

// The rule: 32 k a block, padded with +0 x +0; per block an even and an odd chain of FMAs from +0, then
// t = t + (even + odd); every result flushed.
inline float rule(const std::vector<float>& x, const std::vector<float>& w) {
  const std::size_t K = x.size(), blocks = (K + 31) / 32;
  float t = 0.0f;
  for (std::size_t b = 0; b < blocks; ++b) {
    float chain[2] = {0.0f, 0.0f};
    for (std::size_t i = 0; i < 32; ++i) {
      const std::size_t k = 32 * b + i;
      const float p_x = k < K ? operand(x[k]) : 0.0f, p_w = k < K ? operand(w[k]) : 0.0f;
      chain[i % 2] = ftz(std::fma(p_x, p_w, chain[i % 2]));
    }
    t = ftz(t + ftz(chain[0] + chain[1]));
  }
  return t;
}

// The kBf16Amx tables this CPU has: the FMA table (AVX512-BF16 and VBMI), the AMX one; a warning for each missing.
inline std::vector<const KernelTable*> bf16amx_tables() {
  std::vector<const KernelTable*> t;
  if (avx512_bf16amx_kernels())
    t.push_back(avx512_bf16amx_kernels());
  else
    WARN("no AVX512-BF16 and VBMI on this CPU: the FMA table is not checked here");
  if (amx_bf16_kernels())
    t.push_back(amx_bf16_kernels());
  else
    WARN("no AMX-BF16 on this CPU (or Linux refused the tile state): the AMX table is not checked here");
  return t;
}

}  // namespace tandem::runtime::cpu::test
