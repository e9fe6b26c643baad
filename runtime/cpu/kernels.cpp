// Registry of CPU kernel tables: the one place that picks an ISA.
#include "runtime/cpu/kernels.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "runtime/cpu/row_parallel.h"

namespace tandem::runtime::cpu {

// A stack of partials, [M][n1] each (columns [n0, n1) used); two of one level
// are a subtree's halves and are added at once, the left one keeping the sum.
void matmul_tree_by_parts(const KernelTable& table, const float* x, int64_t ldx, int64_t M, const Matrix* parts,
                          int count, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  thread_local std::vector<std::vector<float>> slots;
  const auto size = static_cast<std::size_t>(M * n1);
  TreeLevels levels;  // of the partials on the stack, slots[i] at position i
  int64_t k0 = 0;
  for (int c = 0; c < count; ++c) {
    const auto top = static_cast<std::size_t>(levels.depth());
    if (slots.size() <= top) slots.resize(top + 1);
    if (slots[top].size() < size) slots[top].resize(size);
    table.matmul(x + k0, ldx, M, parts[c], n0, n1, slots[top].data(), n1);
    k0 += parts[c].cols;
    levels.push([&](int l, int r) {
      float* left = slots[static_cast<std::size_t>(l)].data();
      const float* right = slots[static_cast<std::size_t>(r)].data();
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) left[m * n1 + n] += right[m * n1 + n];
    });
  }
  for (int64_t m = 0; m < M; ++m) std::copy(slots[0].data() + m * n1 + n0, slots[0].data() + m * n1 + n1, y + m * ldy + n0);
}

void dequantize_rows(const Matrix& W, int64_t a, int64_t b, float* out) {
  const int64_t K = W.cols;
  const Scales& s = W.scales;
  const float* fp8 = f8e4m3_table();
  const auto* codes = static_cast<const uint8_t*>(W.data);
  for (int64_t n = a; n < b; ++n) {
    const float* srow = s.grid + ((n + s.r0) / s.block_rows) * s.ld;
    float* o = out + (n - a) * K;
    for (int64_t k0 = 0; k0 < K;) {  // one column block at a time: one scale
      const int64_t cb = (k0 + s.c0) / s.block_cols;
      const int64_t k1 = std::min(K, (cb + 1) * s.block_cols - s.c0);
      const float scale = srow[cb];
      if (W.dtype == DType::kF8E4M3) {
        for (int64_t k = k0; k < k1; ++k) o[k] = fp8[codes[W.index(n, k)]] * scale;
      } else {
        for (int64_t k = k0; k < k1; ++k) o[k] = static_cast<float>(static_cast<int8_t>(codes[W.index(n, k)])) * scale;
      }
      k0 = k1;
    }
  }
}

void matmul_dequantized(const KernelTable& table, const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0,
                        int64_t n1, float* y, int64_t ldy) {
  thread_local std::vector<float> rows;
  constexpr int64_t kRows = 8;
  for (int64_t a = n0; a < n1;) {
    const int64_t b = std::min(n1, (a / kRows + 1) * kRows);  // within one panel
    rows.resize(static_cast<std::size_t>((b - a) * W.cols));
    dequantize_rows(W, a, b, rows.data());
    const Matrix f{rows.data(), DType::kF32, b - a, W.cols, false, {}};
    table.matmul(x, ldx, M, f, 0, b - a, y + a, ldy);
    a = b;
  }
}

namespace {

// max |x[i]|, and whether every x[i] is finite: the scale of an FP8 KV row and of an INT8 activation row.
float row_amax(const float* x, int64_t n, bool& finite) {
  float amax = 0.0f;
  finite = true;
  for (int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

}  // namespace

void quantize_fp8_row(const float* x, int64_t n, uint8_t* row) {
  static const bool wide = avx512_kernels() != nullptr;
  (wide ? quantize_fp8_row_avx512 : quantize_fp8_row_scalar)(x, n, row);
}

void quantize_fp8_row_scalar(const float* x, int64_t n, uint8_t* row) {
  bool finite;
  const float amax = row_amax(x, n, finite);
  const float scale = finite ? amax / 448.0f : std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < n; ++i) row[i] = scale > 0.0f ? f32_to_f8e4m3(x[i] / scale) : 0;
  std::memcpy(row + n, &scale, sizeof scale);
}

void widen_fp8_row_scalar(const uint8_t* row, int64_t n, float* out) {
  float scale;
  std::memcpy(&scale, row + n, sizeof scale);
  const float* value = f8e4m3_table();
  for (int64_t i = 0; i < n; ++i) out[i] = value[row[i]] * scale;
}

namespace {

constexpr int64_t kWidenRows = 64;  // FP8 rows widened at a time: 64 x 128 floats, 32 KiB

// Up to kWidenRows FP8 rows as float32 rows (in buf), and pointers to them.
const void* const* widened(const KernelTable& t, const void* const* rows, int64_t count, int64_t n,
                           std::vector<float>& buf, std::vector<const void*>& ptrs) {
  buf.resize(static_cast<std::size_t>(count * n));
  ptrs.resize(static_cast<std::size_t>(count));
  for (int64_t r = 0; r < count; ++r) {
    t.widen_fp8_row(static_cast<const uint8_t*>(rows[r]), n, buf.data() + r * n);
    ptrs[static_cast<std::size_t>(r)] = buf.data() + r * n;
  }
  return ptrs.data();
}

}  // namespace

void dot_rows_widened(const KernelTable& t, const float* q, int64_t ldq, int64_t M, const void* const* rows,
                      int64_t count, int64_t n, float* out, int64_t ldo) {
  thread_local std::vector<float> buf;
  thread_local std::vector<const void*> ptrs;
  for (int64_t r = 0; r < count; r += kWidenRows) {
    const int64_t c = std::min(kWidenRows, count - r);
    t.dot_rows(q, ldq, M, DType::kF32, widened(t, rows + r, c, n, buf, ptrs), c, n, out + r, ldo);
  }
}

void weighted_sum_widened(const KernelTable& t, const float* w, int64_t ldw, int64_t M, const void* const* rows,
                          int64_t count, int64_t n, bool accumulate, float* out, int64_t ldo) {
  thread_local std::vector<float> buf;
  thread_local std::vector<const void*> ptrs;
  int64_t r = 0;
  do {  // once at least: count 0 without accumulate zeroes the outputs
    const int64_t c = std::min(kWidenRows, count - r);
    t.weighted_sum(w + r, ldw, M, DType::kF32, widened(t, rows + r, c, n, buf, ptrs), c, n, accumulate || r > 0, out,
                   ldo);
    r += kWidenRows;
  } while (r < count);
}

float exp_fixed(float d) {
  if (std::isnan(d)) return d;
  const float x = -104.0f > d ? -104.0f : d;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = std::fma(1.9875691500e-4f, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float y = std::fma(p, r * r, r) + 1.0f;
  return std::ldexp(y, static_cast<int>(n));  // exact but for a subnormal result, rounded once
}

void swiglu_scalar(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i], e = exp_fixed(-std::fabs(x)), s = (x >= 0.0f ? 1.0f : e) / (1.0f + e);
    const float r = x * s * u[i];
    g[i] = std::isnan(r) ? std::numeric_limits<float>::quiet_NaN() : r;
  }
}

void swiglu(float* g, const float* u, int64_t n) {
  static const auto f = [] {  // TANDEM_CPU_KERNELS=scalar|avx2 runs the narrower ones too
    const KernelTable& k = kernels();
    if (&k == &scalar_kernels() || !avx2_kernels()) return swiglu_scalar;
    return avx512_kernels() && &k != avx2_kernels() ? swiglu_avx512 : swiglu_avx2;
  }();
  f(g, u, n);
}

void softmax_scalar(float* s, int64_t n, float scale) {
  float max = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    s[j] *= scale;
    max = s[j] > max ? s[j] : max;
  }
  float l[16] = {};
  for (int64_t j = 0; j < n; ++j) l[j % 16] += (s[j] = exp_fixed(s[j] - max));
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) l[i] += l[i + w];
  for (int64_t j = 0; j < n; ++j) s[j] /= l[0];
}

float quantize_int8_row(const float* x, int64_t n, int8_t* q) {
  bool finite;
  const float amax = row_amax(x, n, finite);
  if (!finite || amax == 0.0f) {
    std::fill(q, q + n, int8_t{0});
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = 127.0f / amax;
  for (int64_t i = 0; i < n; ++i)  // |x| <= amax: within [-127, 127] but for an ulp, which rounds back
    q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
  return amax / 127.0f;
}

float int8_row_scale(const Matrix& W, int64_t n) {
  const Scales& s = W.scales;
  if (s.c0 / s.block_cols != (s.c0 + W.cols - 1) / s.block_cols)
    throw Error("model.cpu_matmul = \"int8\" multiplies INT8 weights with one scale per row; " +
                (s.name ? *s.name : std::string("a matrix")) + " has column blocks: use \"f32\"");
  return s.at(n, 0);
}

void matmul_int8dot_reference(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1,
                              float* y, int64_t ldy) {
  const int64_t K = W.cols;
  std::vector<int8_t> q(static_cast<std::size_t>(K));
  const auto* codes = static_cast<const int8_t*>(W.data);
  for (int64_t m = 0; m < M; ++m) {
    const float xs = quantize_int8_row(x + m * ldx, K, q.data());
    for (int64_t n = n0; n < n1; ++n) {
      int32_t acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += int32_t{q[static_cast<std::size_t>(k)]} * codes[W.index(n, k)];
      y[m * ldy + n] = static_cast<float>(acc) * (xs * int8_row_scale(W, n));
    }
  }
}

namespace {

float flush_subnormal(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }

// A value as kBf16Amx reads it: rounded to bf16 (nearest even), a subnormal 0.
float as_bf16(float v) { return flush_subnormal(bf16_to_f32(f32_to_bf16(flush_subnormal(v)))); }

}  // namespace

void matmul_bf16amx_reference(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1,
                              float* y, int64_t ldy) {
  const int64_t K = W.cols, Kp = (K + 31) / 32 * 32;
  std::vector<float> xb(static_cast<std::size_t>(Kp)), wb(static_cast<std::size_t>(Kp));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) xb[static_cast<std::size_t>(k)] = as_bf16(x[m * ldx + k]);
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t k = 0; k < K; ++k) wb[static_cast<std::size_t>(k)] = as_bf16(W.at(n, k));
      float t = 0.0f;
      for (int64_t b = 0; b < Kp; b += 32) {
        float e = 0.0f, o = 0.0f;
        for (int64_t k = b; k < b + 32; k += 2) {
          const auto i = static_cast<std::size_t>(k);
          e = flush_subnormal(std::fma(xb[i], wb[i], e));
          o = flush_subnormal(std::fma(xb[i + 1], wb[i + 1], o));
        }
        t = flush_subnormal(t + flush_subnormal(e + o));
      }
      y[m * ldy + n] = t;
    }
  }
}

bool amx_usable(unsigned feature) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << feature))) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // Linux's permission for the tile data
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

namespace {

const KernelTable* chosen = nullptr;

const KernelTable& best_f32() {
  if (const KernelTable* t = avx512_gfni_kernels()) return *t;
  if (const KernelTable* t = avx512_kernels()) return *t;
  if (const KernelTable* t = avx2_kernels()) return *t;
  return scalar_kernels();
}

}  // namespace

void use_kernels(MatmulMode mode) {
  if (mode == MatmulMode::kF32) {
    chosen = &best_f32();
    return;
  }
  if (mode == MatmulMode::kInt8Dot) {
    chosen = avx512_amx_kernels() ? avx512_amx_kernels() : avx512_vnni_kernels();
    if (!chosen)
      throw Error("model.cpu_matmul = \"int8\" needs a CPU with AVX512-VNNI (vpdpbusd: Cascade Lake, Ice Lake, Zen 4 "
                  "and later), and this one has none; use \"f32\"");
    return;
  }
  if (mode == MatmulMode::kBf16Amx) {
    chosen = amx_bf16_kernels() ? amx_bf16_kernels() : avx512_bf16amx_kernels();
    if (!chosen)
      throw Error("model.cpu_matmul = \"bf16-amx\" needs a CPU with AVX512-BF16 and AVX512-VBMI (Zen 4, Sapphire "
                  "Rapids and later; AMX-BF16 to be fast), and this one lacks them; use \"f32\"");
    return;
  }
  chosen = avx512_bf16_kernels();
  if (!chosen)
    throw Error("model.cpu_matmul = \"bf16\" needs a CPU with AVX512-BF16 (vdpbf16ps), and this one has none; use "
                "\"f32\"");
}

const KernelTable& kernels() {
  // TANDEM_CPU_KERNELS=scalar|avx2|avx512|avx512-bf16|avx512-vnni|amx-int8|avx512-bf16amx|amx-bf16
  // forces a table (scalar, avx2 and avx512 cap the ISA, with kF32's bits).
  static const KernelTable* forced = [] () -> const KernelTable* {
    const char* force = std::getenv("TANDEM_CPU_KERNELS");
    if (!force) return nullptr;
    if (std::strcmp(force, "scalar") == 0) return &scalar_kernels();
    if (std::strcmp(force, "avx2") == 0) return avx2_kernels() ? avx2_kernels() : &scalar_kernels();
    if (std::strcmp(force, "avx512") == 0 && avx512_kernels()) return avx512_kernels();
    if (std::strcmp(force, "avx512-bf16") == 0 && avx512_bf16_kernels()) return avx512_bf16_kernels();
    if (std::strcmp(force, "avx512-vnni") == 0 && avx512_vnni_kernels()) return avx512_vnni_kernels();
    if (std::strcmp(force, "amx-int8") == 0 && avx512_amx_kernels()) return avx512_amx_kernels();
    if (std::strcmp(force, "avx512-bf16amx") == 0 && avx512_bf16amx_kernels()) return avx512_bf16amx_kernels();
    if (std::strcmp(force, "amx-bf16") == 0 && amx_bf16_kernels()) return amx_bf16_kernels();
    return nullptr;
  }();
  if (forced) return *forced;
  if (!chosen) chosen = &best_f32();
  return *chosen;
}

}  // namespace tandem::runtime::cpu
