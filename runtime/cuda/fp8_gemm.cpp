#include "runtime/cuda/fp8_gemm.h"

#include <string>

#include "common/error.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

template <class T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& v) {
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof v));
}

}  // namespace

// The descriptors of one call, destroyed with it.
struct Fp8Gemm::Call {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Call() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    for (cublasLtMatrixLayout_t l : {a, b, d})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Fp8Gemm::Fp8Gemm(void* workspace, std::size_t bytes) : workspace_(workspace), workspace_bytes_(bytes) {
  TANDEM_CUBLAS_CHECK(cublasLtCreate(&lt_));
}

Fp8Gemm::~Fp8Gemm() {
  if (lt_) cublasLtDestroy(lt_);
}

std::string Fp8Gemm::unsupported() {
  int device = 0, major = 0, minor = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major == 9) return "";
  return "cuBLASLt's FP8 products in 128x128 blocks run on Hopper GPUs (compute capability 9.x); this one is " +
         std::to_string(major) + "." + std::to_string(minor);
}

void Fp8Gemm::describe(Call& c, const float* w_scales, int64_t w_scale_ld, int64_t n, int64_t k, const float* x_scales,
                       int64_t rows, int64_t ldy) const {
  if (k % kFp8Group != 0 || rows % 8 != 0 || n % 4 != 0 || w_scale_ld % 4 != 0 || w_scale_ld < k / kFp8Group)
    throw Error("internal: an FP8 block product needs k a multiple of 128, rows a multiple of 8, n and the weights' "
                "scale rows multiples of 4");
  // Row-major y[rows][n] = x[rows][k] W^T is, column-major, y^T (n x rows) = (W^T)^T (k x n, transposed) * x^T (k x rows):
  // A = W with its 128x128 blocks' scales, B = x with a scale per 128 of each column (its row), D float32.
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&c.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set(c.desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t{CUBLAS_OP_T});
  set(c.desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t{CUBLAS_OP_N});
  set(c.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F});
  set(c.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F});
  set(c.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(w_scales));
  set(c.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(x_scales));
  set(c.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0});  // block scaling promotes the sums itself
  TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.a, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
  TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.b, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(rows), k));
  TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.d, CUDA_R_32F, static_cast<uint64_t>(n), static_cast<uint64_t>(rows), ldy));
}

const cublasLtMatmulAlgo_t& Fp8Gemm::algo(Call& c, int64_t n, int64_t k, int64_t rows) {
  auto at = algos_.find({n, k, rows});
  if (at != algos_.end()) return at->second;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&c.pref));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_bytes_, sizeof workspace_bytes_));
  cublasLtMatmulHeuristicResult_t found{};
  int count = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, c.desc, c.a, c.b, c.d, c.d, c.pref, 1, &found, &count);
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) TANDEM_CUBLAS_CHECK(st);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || count == 0)
    throw Error("cuBLASLt has no FP8 block-scaled product for " + std::to_string(rows) + " x " + std::to_string(k) +
                " by " + std::to_string(n) + " on this GPU; use model.gpu_matmul = \"auto\"");
  if (algos_.size() >= 4096) algos_.clear();  // prefill steps of many sizes: a bound, not a leak
  return algos_.emplace(std::array<int64_t, 3>{n, k, rows}, found.algo).first->second;
}

void Fp8Gemm::prepare(const float* w_scales, int64_t w_scale_ld, int64_t n, int64_t k, int64_t rows) {
  Call c;
  // x's scales: any device address (the heuristic reads no scale; a run sets its own)
  describe(c, w_scales, w_scale_ld, n, k, w_scales, fp8_scale_ld(rows), n);
  algo(c, n, k, fp8_scale_ld(rows));
}

void Fp8Gemm::run(const uint8_t* w, const float* w_scales, int64_t w_scale_ld, int64_t n, int64_t k, const uint8_t* x,
                  const float* x_scales, int64_t rows, float* y, int64_t ldy, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  Call c;
  describe(c, w_scales, w_scale_ld, n, k, x_scales, rows, ldy);
  const cublasLtMatmulAlgo_t& a = algo(c, n, k, rows);
  const float alpha = 1.0f, beta = 0.0f;
  TANDEM_CUBLAS_CHECK(cublasLtMatmul(lt_, c.desc, &alpha, w, c.a, x, c.b, &beta, y, c.d, y, c.d, &a, workspace_,
                                     workspace_bytes_, stream));
}

}  // namespace tandem::runtime::cuda
