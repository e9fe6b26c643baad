// Element types of weights and KV blocks, and exact conversions to float.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace tandem::runtime {

// kF8E4M3 and kI8 are quantized checkpoints' weights (runtime/model/quantization.h):
// codes whose values are scaled per block (Matrix::scales, weights.h).
enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI8 };

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", "f16", "f8e4m3", "i8"
// From safetensors' names ("F32", "BF16", "F16", "F8_E4M3", "I8") or ours; false when unknown.
bool parse_dtype(std::string_view name, DType& out);
std::string_view safetensors_name(DType t);  // "F32", "BF16", "F16", "F8_E4M3", "I8"

inline float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// As vcvtneps2bf16 rounds (AVX512-BF16): to nearest even, a float32 subnormal as a zero of its sign, NaN quiet.
// What a bf16 KV pool holds (CpuModel::store_kv): the bf16 that kBf16Amx attention makes of a float32 KV element,
// so under model.cpu_matmul = "bf16-amx" the pool's dtype does not change a bit.
inline uint16_t f32_to_bf16_flushed(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7F800000u) == 0) return static_cast<uint16_t>(bits >> 16 & 0x8000u);
  return f32_to_bf16(f);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// OCP FP8 E4M3 ("e4m3fn": 1 sign, 4 exponent bits with bias 7, 3 mantissa
// bits; no infinities, 0x7F and 0xFF are NaN): exact to float.
float f8e4m3_to_f32(uint8_t b);
const float* f8e4m3_table();  // the 256 values, by code
// Nearest E4M3 to f (ties to even), saturating at +-448, the largest finite. On the float's bits, inline (KV
// rows are quantized as they are stored: frexp, ldexp and nearbyint took ~14% of a prefill with kv.dtype =
// "fp8"). Every one of the 2^32 floats gives what the statement in libm's terms does (model_load_test.cpp holds
// it): NaN -> 0x7F; |f| >= 448 (infinities too) -> the largest finite; from 2^-6, the mantissa rounded to 3
// bits, ties to even (a carry moves the exponent up); below, the nearest multiple of 2^-9, ties to even
// (subnormal codes, 8 being the smallest normal's).
inline uint8_t f32_to_f8e4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7F;
  if (a >= 0x43E00000u) return sign | 0x7E;  // 448
  if (a >= 0x3C800000u) {                    // 2^-6: E4M3's exponent is float's less 120
    const uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1u);
    return sign | static_cast<uint8_t>((r >> 20) - (120u << 3));
  }
  // |f| x 2^9 = m x 2^-s, rounded to an integer (0 to 8)
  const uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | (e ? 0x800000u : 0u), s = 141 - e;
  if (s > 24) return sign;  // below 2^-10
  const uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
  return sign | static_cast<uint8_t>(q + (rem > half || (rem == half && (q & 1u))));
}

// f(std::integral_constant<DType, t>{}): a kernel templated on the element
// type, chosen at run time (f's parameter is `auto d`; the type is
// decltype(d)::value).
// Only f32, bf16 and f16: 8-bit matrices take their own kernel paths (they need their scales).
template <class F>
decltype(auto) with_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kBF16: return f(std::integral_constant<DType, DType::kBF16>{});
    case DType::kF16: return f(std::integral_constant<DType, DType::kF16>{});
    case DType::kF32: break;
    case DType::kF8E4M3:
    case DType::kI8: throw std::logic_error("internal: an 8-bit matrix reached a kernel that does not scale its codes");
  }
  return f(std::integral_constant<DType, DType::kF32>{});
}

// Element i of a tensor of type t, as float.
inline float load_as_f32(const void* data, DType t, std::size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF8E4M3: return f8e4m3_table()[static_cast<const uint8_t*>(data)[i]];
    case DType::kI8: return static_cast<float>(static_cast<const int8_t*>(data)[i]);
  }
  return 0.0f;
}

}  // namespace tandem::runtime
