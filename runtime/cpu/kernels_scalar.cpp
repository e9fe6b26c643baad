// The portable kernel table: the exact arithmetic of kernels_avx2.cpp, in C++.
#include <cmath>

#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {
namespace {

// The fixed 8-lane dot product described in kernels.h.
template <class LoadB>
float dot8(const float* a, LoadB b, int64_t n) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t k = 0; k < n8; k += 8)
    for (int j = 0; j < 8; ++j) l[j] = std::fma(a[k + j], b(k + j), l[j]);
  float r = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  for (int64_t k = n8; k < n; ++k) r = std::fma(a[k], b(k), r);
  return r;
}

void matmul(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t K = W.cols;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * ldx;
      float r = 0;
      switch (W.dtype) {
        case DType::kF32: {
          const float* w = static_cast<const float*>(W.data);
          r = dot8(xr, [&](int64_t k) { return w[W.index(n, k)]; }, K);
          break;
        }
        case DType::kBF16: {
          const uint16_t* w = static_cast<const uint16_t*>(W.data);
          r = dot8(xr, [&](int64_t k) { return bf16_to_f32(w[W.index(n, k)]); }, K);
          break;
        }
        case DType::kF16: {
          const uint16_t* w = static_cast<const uint16_t*>(W.data);
          r = dot8(xr, [&](int64_t k) { return f16_to_f32(w[W.index(n, k)]); }, K);
          break;
        }
        case DType::kF8E4M3:
        case DType::kI8:
          r = dot8(xr, [&](int64_t k) { return W.at(n, k); }, K);  // code x scale, one rounding
          break;
      }
      y[m * ldy + n] = r;
    }
  }
}

float dot(const float* a, const float* b, int64_t n) {
  return dot8(a, [b](int64_t k) { return b[k]; }, n);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

void dot_rows(const float* q, int64_t ldq, int64_t M, DType kv, const void* const* rows, int64_t count, int64_t n,
              float* out, int64_t ldo) {
  if (kv == DType::kF8E4M3) return dot_rows_widened(scalar_kernels(), q, ldq, M, rows, count, n, out, ldo);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t r = 0; r < count; ++r)
      out[m * ldo + r] = dot8(q + m * ldq, [&](int64_t k) { return load_as_f32(rows[r], kv, static_cast<std::size_t>(k)); }, n);
}

void weighted_sum(const float* w, int64_t ldw, int64_t M, DType kv, const void* const* rows, int64_t count, int64_t n,
                  bool accumulate, float* out, int64_t ldo) {
  if (kv == DType::kF8E4M3)
    return weighted_sum_widened(scalar_kernels(), w, ldw, M, rows, count, n, accumulate, out, ldo);
  for (int64_t m = 0; m < M; ++m) {
    float* o = out + m * ldo;
    if (!accumulate)
      for (int64_t i = 0; i < n; ++i) o[i] = 0.0f;
    for (int64_t r = 0; r < count; ++r) {
      const float a = w[m * ldw + r];
      for (int64_t i = 0; i < n; ++i) o[i] = std::fma(a, load_as_f32(rows[r], kv, static_cast<std::size_t>(i)), o[i]);
    }
  }
}

void matmul_tree(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0, int64_t n1,
                 float* y, int64_t ldy) {
  matmul_tree_by_parts(scalar_kernels(), x, ldx, M, parts, count, n0, n1, y, ldy);
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable t{"scalar", matmul, dot, axpy, dot_rows, weighted_sum, matmul_tree,
                             widen_fp8_row_scalar, softmax_scalar};
  return t;
}

}  // namespace tandem::runtime::cpu
