#include "runtime/model/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace tandem::runtime {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16:
    case DType::kF16: return 2;
    case DType::kF8E4M3:
    case DType::kI8: return 1;
  }
  return 4;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kI8: return "i8";
  }
  return "?";
}

std::string_view safetensors_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kI8: return "I8";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType& out) {
  if (name == "F32" || name == "f32" || name == "float32") out = DType::kF32;
  else if (name == "BF16" || name == "bf16" || name == "bfloat16") out = DType::kBF16;
  else if (name == "F16" || name == "f16" || name == "float16") out = DType::kF16;
  else if (name == "F8_E4M3" || name == "f8e4m3") out = DType::kF8E4M3;
  else if (name == "I8" || name == "i8") out = DType::kI8;
  else return false;
  return true;
}

float f8e4m3_to_f32(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xF, man = b & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  return sign * std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
}

const float* f8e4m3_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[static_cast<std::size_t>(b)] = f8e4m3_to_f32(static_cast<uint8_t>(b));
    return t;
  }();
  return table.data();
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
