#include "runtime/model/dtype.h"

#include <cmath>

namespace tandem::runtime {

std::size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType& out) {
  if (name == "F32" || name == "f32" || name == "float32") out = DType::kF32;
  else if (name == "BF16" || name == "bf16" || name == "bfloat16") out = DType::kBF16;
  else if (name == "F16" || name == "f16" || name == "float16") out = DType::kF16;
  else return false;
  return true;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: value = man * 2^-24
      const float v = std::ldexp(static_cast<float>(man), -24);
      std::memcpy(&bits, &v, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000 | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7E00;
  if (a >= 65520.0f) return sign | 0x7C00;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {          // subnormal or zero: multiples of 2^-24, round to nearest even
    const float q = std::nearbyint(a * 16777216.0f);
    return sign | static_cast<uint16_t>(q);
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  float q = std::nearbyint(std::ldexp(m, 11));  // 11 significant bits
  if (q >= 2048.0f) {
    q /= 2;
    ++e;
  }
  const uint16_t exp = static_cast<uint16_t>(e - 1 + 15);
  return sign | static_cast<uint16_t>(exp << 10) | (static_cast<uint16_t>(q) & 0x3FF);
}

}  // namespace tandem::runtime
