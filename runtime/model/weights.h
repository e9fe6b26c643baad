// The weights of a model, bound by name and shape-checked against its config.
// Matrices stay in the checkpoint's dtype inside the memory-mapped files (bf16
// stays bf16); small vectors (norms, biases) are copied to float.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "runtime/model/dtype.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem::runtime {

// A [rows][cols] matrix; a linear layer's weight is [out][in].
//
// Two layouts. Row-major, as in the checkpoint. Or panels (only when cols % 8
// == 0): rows grouped in panels of eight, a panel stored as [cols / 8][8 rows]
// [8], so the eight weights of row n at k..k+7 (k % 8 == 0) are contiguous at
// element panel(n) + 8 * k + 8 * (n % 8), and a matrix-vector product reads one
// sequential stream instead of eight (a decode step is that stream: ~30% more
// of the memory bandwidth here, perf/engine_bench). The last panel is padded
// with zero rows. The layout changes where weights are, never the arithmetic.
// An 8-bit matrix's scales (quantization.h): weight (n, k) is code(n, k) x
// the f32 scale of its block, one f32 product (the value torch's
// q.float() * scale gives). The grid covers the checkpoint's whole matrix;
// (r0, c0) is where this matrix's (0, 0) sits in it (a shard, a column chunk).
struct Scales {
  const float* grid = nullptr;      // [ceil(R / block_rows)][ld]
  int64_t block_rows = 1, block_cols = 1, ld = 1;
  int64_t r0 = 0, c0 = 0;
  const std::string* name = nullptr;  // the checkpoint tensor's, for messages

  float at(int64_t n, int64_t k) const { return grid[((n + r0) / block_rows) * ld + (k + c0) / block_cols]; }
};

struct Matrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  bool panels = false;
  Scales scales;  // 8-bit dtypes only

  bool quantized() const { return dtype_size(dtype) == 1; }

  // Offset, in elements, of weight (n, k).
  std::size_t index(int64_t n, int64_t k) const {
    if (!panels) return static_cast<std::size_t>(n * cols + k);
    return static_cast<std::size_t>((n >> 3) * 8 * cols + 8 * (k & ~int64_t{7}) + 8 * (n & 7) + (k & 7));
  }
  // Weight (n, k) as float: widened exactly, or an 8-bit code times its scale. n < rows.
  float at(int64_t n, int64_t k) const {
    const float v = load_as_f32(data, dtype, index(n, k));
    return quantized() ? v * scales.at(n, k) : v;
  }
  // Rows [a, b) of the matrix as a view: the same memory (a % 8 == 0 in panels).
  Matrix row_view(int64_t a, int64_t b) const {
    Matrix v = *this;
    v.data = static_cast<const uint8_t*>(data) + static_cast<std::size_t>(a * cols) * dtype_size(dtype);  // index(a, 0)
    v.rows = b - a;
    v.scales.r0 += a;
    return v;
  }
};

// Storage of panel-layout copies (64-byte aligned, huge pages where the
// kernel allows). pack_panels returns m itself when cols % 8 != 0.
class PanelStore {
 public:
  PanelStore() = default;
  PanelStore(const PanelStore&) = delete;
  PanelStore& operator=(const PanelStore&) = delete;
  ~PanelStore();
  Matrix pack(const Matrix& m);
  // Columns [k0, k1) of m as a matrix of their own (copied): in panels when
  // k0 and k1 - k0 are multiples of 8, else row-major. m may be in either layout.
  Matrix pack_columns(const Matrix& m, int64_t k0, int64_t k1) { return pack_slice(m, 0, m.rows, k0, k1); }
  // Rows [r0, r1) and columns [k0, k1) of m, likewise.
  Matrix pack_slice(const Matrix& m, int64_t r0, int64_t r1, int64_t k0, int64_t k1);
  std::size_t bytes() const { return bytes_; }

 private:
  std::vector<std::pair<void*, std::size_t>> blocks_;
  std::size_t bytes_ = 0;
};

// One expert of a mixture of experts: a SwiGLU MLP of MoeConfig::intermediate units.
struct ExpertWeights {
  Matrix gate, up, down;  // [units][hidden] x2, [hidden][units]
};

struct LayerWeights {
  std::vector<float> attn_norm;          // [hidden]
  Matrix wq, wk, wv, wo;                 // [heads*hd][hidden], [kv*hd][hidden] x2, [hidden][heads*hd]
  std::vector<float> bq, bk, bv;         // qkv_bias only: [heads*hd], [kv*hd], [kv*hd]
  std::vector<float> bo;                 // o_bias only: [hidden]
  std::vector<float> q_norm, k_norm;     // qk_norm only: [head_dim]
  std::vector<float> mlp_norm;           // [hidden]
  Matrix w_gate, w_up, w_down;           // [inter][hidden] x2, [hidden][inter]; a dense layer's MLP
  Matrix router;                         // a MoE layer's (MoeConfig::at): [experts][hidden]
  std::vector<ExpertWeights> experts;    // and its experts, in id order
};

struct ModelWeights {
  Matrix embed;                     // [vocab][hidden], row-major (looked up by token)
  Matrix lm_head;                   // [vocab][hidden]; the embedding's values when tied; no data: none (an
                                    // embedding model's checkpoint: it answers embeddings only)
  std::vector<float> final_norm;    // [hidden]
  std::vector<LayerWeights> layers;
  std::unique_ptr<Checkpoint> checkpoint;  // owns the mappings row-major matrices point into
  std::unique_ptr<PanelStore> panels;      // owns the panel-layout copies
  std::vector<std::vector<float>> scale_grids;  // a quantized checkpoint's scales as f32 (quantization.h)
  std::vector<std::vector<uint8_t>> converted;  // matrices converted or quantized as they loaded (config.load_as)

  // Throws tandem::Error with one line naming the tensor and file: missing
  // tensor, wrong shape, unsupported dtype, truncated shard, a quantized
  // weight without its scale. With panels (the default) the linear layers
  // and the LM head are copied into the panel layout, in their own dtype;
  // otherwise every matrix stays in the mapping. A quantized checkpoint's
  // weights stay 8-bit, with their scales (as f32) beside them.
  static std::unique_ptr<ModelWeights> load(const ModelConfig& config, const std::filesystem::path& model_dir,
                                            bool panels = true);
  // The same checks as load (every tensor present, shaped and typed, every
  // quantized weight's scales), computing nothing: maps the files, reads no
  // weight. For the router rank's checks before any work starts.
  static void check(const ModelConfig& config, const std::filesystem::path& model_dir);

 private:
  static std::unique_ptr<ModelWeights> bind(const ModelConfig& config, const std::filesystem::path& model_dir, bool panels,
                                            bool compute);
};

}  // namespace tandem::runtime
