#include "runtime/model/weights.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "runtime/model/quantize.h"

namespace tandem::runtime {
namespace {

struct Binder {
  const Checkpoint& ckpt;
  const ModelConfig& config;
  std::string dir;
  std::vector<std::vector<float>>* scale_grids;  // where a quantized weight's scales go; null: check only
  std::vector<std::vector<uint8_t>>* converted;  // model.dtype's converted matrices
  // What stands for "model." in the names: "" for a checkpoint saved from the
  // inner model alone (sentence-transformers' embedding models: embed_tokens.weight, layers.N...).
  std::string prefix = "model.";

  std::string named(const std::string& name) const {
    return name.rfind("model.", 0) == 0 ? prefix + name.substr(6) : name;
  }
  const TensorView& get(const std::string& wanted, std::vector<int64_t> shape) const {
    const std::string name = named(wanted);
    const TensorView* t = ckpt.find(name);
    TensorView expected;
    expected.shape = shape;
    if (!t) {
      throw Error(dir + ": tensor '" + name + "' is missing (expected " + expected.shape_string() + " for " +
                  config.architecture + "; is this checkpoint complete?)");
    }
    if (t->shape != shape) {
      throw Error(t->file + ": tensor '" + name + "' has shape " + t->shape_string() + " but config.json implies " +
                  expected.shape_string());
    }
    return *t;
  }
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const TensorView& t = get(name, {rows, cols});
    if (dtype_size(t.dtype) == 1) return convert(dequantize(t, rows, cols), t);
    return convert(Matrix{t.data, t.dtype, rows, cols, false, {}}, t);
  }

  // model.dtype: the matrix converted or quantized as it loads (the whole matrix, so a shard of it is the
  // same whatever the width), held in memory the weights own.
  Matrix convert(Matrix m, const TensorView& t) const {
    const std::string& as = config.load_as;
    if (as == "auto" || !scale_grids) return m;
    if (as == "fp8" || as == "int8") {
      if (!quantizable_weight(t.name)) return m;
      QuantizedWeight q = quantize_weight(t, as == "fp8" ? "fp8-block" : "int8-channel");
      m.data = converted->emplace_back(std::move(q.q)).data();
      m.dtype = q.dtype;
      m.scales = Scales{};
      m.scales.block_rows = q.block_rows;
      m.scales.block_cols = q.block_cols;
      m.scales.ld = q.scale_cols;
      m.scales.name = &t.name;
      m.scales.grid = scale_grids->emplace_back(std::move(q.scales)).data();
      return m;
    }
    DType target = DType::kF32;
    if (!parse_dtype(as, target) || dtype_size(target) == 1) throw Error("model.dtype '" + as + "' is not a dtype");
    if (m.dtype == target) return m;
    std::vector<uint8_t>& bytes = converted->emplace_back(static_cast<std::size_t>(m.rows * m.cols) * dtype_size(target));
    for (int64_t n = 0; n < m.rows; ++n) {
      for (int64_t k = 0; k < m.cols; ++k) {
        const float v = m.at(n, k);
        const auto i = static_cast<std::size_t>(n * m.cols + k);
        if (target == DType::kF32) std::memcpy(bytes.data() + 4 * i, &v, 4);
        else {
          const uint16_t h = target == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
          std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
      }
    }
    return Matrix{bytes.data(), target, m.rows, m.cols, false, {}};
  }

  // The 8-bit codes stay in the mapping; their scales are read into an f32 grid (quantization.h).
  Matrix dequantize(const TensorView& t, int64_t rows, int64_t cols) const {
    const QuantConfig& q = config.quant;
    if (!q.any())
      throw Error(t.file + ": tensor '" + t.name + "' is " + std::string(safetensors_name(t.dtype)) +
                  " but config.json has no quantization_config saying how to scale it");
    if (t.dtype != q.weight)
      throw Error(t.file + ": tensor '" + t.name + "' is " + std::string(safetensors_name(t.dtype)) + " but " + q.name() +
                  " weights are " + std::string(safetensors_name(q.weight)));
    const std::string scale_name = t.name.substr(0, t.name.size() - std::string("weight").size()) + q.scale_suffix;
    const int64_t br = q.block_rows > 0 ? q.block_rows : rows, bc = q.block_cols > 0 ? q.block_cols : cols;
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    const TensorView* s = ckpt.find(scale_name);
    if (!s) throw Error(dir + ": tensor '" + scale_name + "' (the scales of " + q.name() + " '" + t.name + "') is missing");
    if (s->numel() != sr * sc || dtype_size(s->dtype) == 1) {
      TensorView want;
      want.shape = {sr, sc};
      throw Error(s->file + ": tensor '" + scale_name + "' has shape " + s->shape_string() + " and dtype " +
                  std::string(safetensors_name(s->dtype)) + "; " + q.name() + " scales of a " + std::to_string(rows) +
                  " x " + std::to_string(cols) + " weight are " + want.shape_string() + " f32, bf16 or f16");
    }
    Matrix m{t.data, t.dtype, rows, cols, false, {}};
    m.scales.block_rows = br;
    m.scales.block_cols = bc;
    m.scales.ld = sc;
    m.scales.name = &t.name;
    if (!scale_grids) return m;  // checked, not computed on
    std::vector<float>& grid = scale_grids->emplace_back(static_cast<std::size_t>(sr * sc));
    for (std::size_t i = 0; i < grid.size(); ++i) {
      grid[i] = load_as_f32(s->data, s->dtype, i);
      if (!std::isfinite(grid[i]) || grid[i] < 0)
        throw Error(s->file + ": tensor '" + scale_name + "' holds the scale " + std::to_string(grid[i]) + " at element " +
                    std::to_string(i) + "; scales are finite and not negative");
    }
    m.scales.grid = grid.data();
    return m;
  }
  std::vector<float> vector(const std::string& name, int64_t n) const {
    const TensorView& t = get(name, {n});
    std::vector<float> v(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = load_as_f32(t.data, t.dtype, static_cast<std::size_t>(i));
    return v;
  }
};

}  // namespace

namespace {

// An FP8 code 0x7F / 0xFF is NaN: a damaged checkpoint, refused when its matrix is copied for use.
void refuse_nan_codes(const Matrix& m, const Matrix& copy) {
  if (m.dtype != DType::kF8E4M3) return;
  const auto* p = static_cast<const uint8_t*>(copy.data);
  const std::size_t n = static_cast<std::size_t>((copy.panels ? (copy.rows + 7) / 8 * 8 : copy.rows) * copy.cols);
  bool any = false;
  for (std::size_t i = 0; i < n; ++i) any |= (p[i] & 0x7F) == 0x7F;
  if (!any) return;
  for (int64_t r = 0; r < copy.rows; ++r)
    for (int64_t k = 0; k < copy.cols; ++k)
      if ((p[copy.index(r, k)] & 0x7F) == 0x7F)
        throw Error("tensor '" + (m.scales.name ? *m.scales.name : std::string("?")) + "' holds an FP8 NaN (byte 0x" +
                    (p[copy.index(r, k)] == 0x7F ? std::string("7F") : std::string("FF")) + ") at row " +
                    std::to_string(r + copy.scales.r0) + ", column " + std::to_string(k + copy.scales.c0) +
                    ": the checkpoint is damaged; download or quantize it again");
}

}  // namespace

PanelStore::~PanelStore() {
  for (auto& [p, n] : blocks_) std::free(p);
}

Matrix PanelStore::pack_slice(const Matrix& m, int64_t r0, int64_t r1, int64_t k0, int64_t k1) {
  const std::size_t es = dtype_size(m.dtype);
  const int64_t cols = k1 - k0, used = r1 - r0;
  const bool panels = k0 % 8 == 0 && cols % 8 == 0 && cols > 0;
  const int64_t rows = panels ? (used + 7) / 8 * 8 : used;
  const std::size_t bytes = static_cast<std::size_t>(rows * cols) * es;
  constexpr std::size_t kAlign = 64;
  void* p = std::aligned_alloc(kAlign, std::max<std::size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign));
  if (!p) throw Error("out of memory: cannot allocate " + std::to_string(bytes >> 20) + " MiB for the weights");
  blocks_.emplace_back(p, bytes);
  bytes_ += bytes;
  Matrix out = m;
  out.data = p;
  out.rows = used;
  out.cols = cols;
  out.panels = panels;
  out.scales.r0 += r0;
  out.scales.c0 += k0;
  auto* dst = static_cast<uint8_t*>(p);
  const auto* src = static_cast<const uint8_t*>(m.data);
  for (int64_t n = 0; n < rows; ++n) {
    if (panels) {
      for (int64_t k = 0; k < cols; k += 8) {  // eight weights of one row are contiguous in both layouts
        uint8_t* d = dst + out.index(n, k) * es;
        if (n < used) std::memcpy(d, src + m.index(r0 + n, k0 + k) * es, 8 * es);
        else std::memset(d, 0, 8 * es);
      }
    } else {
      for (int64_t k = 0; k < cols; ++k)
        std::memcpy(dst + out.index(n, k) * es, src + m.index(r0 + n, k0 + k) * es, es);
    }
  }
  refuse_nan_codes(m, out);
  return out;
}

Matrix PanelStore::pack(const Matrix& m) {
  if (m.panels || m.cols % 8 != 0 || m.rows == 0) return m;
  const std::size_t es = dtype_size(m.dtype);
  const int64_t padded_rows = (m.rows + 7) / 8 * 8;
  const std::size_t bytes = static_cast<std::size_t>(padded_rows * m.cols) * es;
  // Huge-page aligned (fewer TLB misses on the stream) when a matrix fills one; a small one (an expert
  // of a tiny model) would waste most of its 2 MiB.
  const std::size_t kAlign = bytes >= (std::size_t{2} << 20) ? std::size_t{2} << 20 : 64;
  void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (!p) throw Error("out of memory: cannot allocate " + std::to_string(bytes >> 20) + " MiB for the weights");
#ifdef MADV_HUGEPAGE
  madvise(p, (bytes + kAlign - 1) / kAlign * kAlign, MADV_HUGEPAGE);
#endif
  blocks_.emplace_back(p, bytes);
  bytes_ += bytes;
  Matrix out = m;
  out.data = p;
  out.panels = true;
  auto* dst = static_cast<uint8_t*>(p);
  const auto* src = static_cast<const uint8_t*>(m.data);
  const std::size_t chunk = 8 * es;  // eight weights of one row
  for (int64_t n = 0; n < padded_rows; ++n) {
    for (int64_t k = 0; k < m.cols; k += 8) {
      uint8_t* d = dst + out.index(n, k) * es;
      if (n < m.rows) std::memcpy(d, src + m.index(n, k) * es, chunk);
      else std::memset(d, 0, chunk);
    }
  }
  refuse_nan_codes(m, out);
  return out;
}

void ModelWeights::check(const ModelConfig& c, const std::filesystem::path& model_dir) {
  bind(c, model_dir, /*panels=*/false, /*compute=*/false);
}

std::unique_ptr<ModelWeights> ModelWeights::load(const ModelConfig& c, const std::filesystem::path& model_dir,
                                                 bool panels) {
  return bind(c, model_dir, panels, /*compute=*/true);
}

std::unique_ptr<ModelWeights> ModelWeights::bind(const ModelConfig& c, const std::filesystem::path& model_dir, bool panels,
                                                 bool compute) {
  auto w = std::make_unique<ModelWeights>();
  w->checkpoint = Checkpoint::open(model_dir);
  Binder b{*w->checkpoint, c, model_dir.string(), compute ? &w->scale_grids : nullptr, &w->converted};
  if (!w->checkpoint->find("model.embed_tokens.weight") && w->checkpoint->find("embed_tokens.weight")) b.prefix = "";
  const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
  w->embed = b.matrix("model.embed_tokens.weight", c.vocab, c.hidden);
  if (c.tie_embeddings && !w->checkpoint->find("lm_head.weight")) w->lm_head = w->embed;
  else if (!w->checkpoint->find("lm_head.weight")) w->lm_head = Matrix{};  // an embedding model: no generation
  else w->lm_head = b.matrix("lm_head.weight", c.vocab, c.hidden);
  w->final_norm = b.vector("model.norm.weight", c.hidden);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights l;
    l.attn_norm = b.vector(p + "input_layernorm.weight", c.hidden);
    l.wq = b.matrix(p + "self_attn.q_proj.weight", q_dim, c.hidden);
    l.wk = b.matrix(p + "self_attn.k_proj.weight", kv_dim, c.hidden);
    l.wv = b.matrix(p + "self_attn.v_proj.weight", kv_dim, c.hidden);
    l.wo = b.matrix(p + "self_attn.o_proj.weight", c.hidden, q_dim);
    if (c.qkv_bias) {
      l.bq = b.vector(p + "self_attn.q_proj.bias", q_dim);
      l.bk = b.vector(p + "self_attn.k_proj.bias", kv_dim);
      l.bv = b.vector(p + "self_attn.v_proj.bias", kv_dim);
    }
    if (c.o_bias) l.bo = b.vector(p + "self_attn.o_proj.bias", c.hidden);
    if (c.qk_norm) {
      l.q_norm = b.vector(p + "self_attn.q_norm.weight", c.head_dim);
      l.k_norm = b.vector(p + "self_attn.k_norm.weight", c.head_dim);
    }
    l.mlp_norm = b.vector(p + "post_attention_layernorm.weight", c.hidden);
    if (c.moe.at(i)) {
      // Qwen3-MoE: mlp.gate (the router), mlp.experts.E.{gate,up,down}_proj; Mixtral:
      // block_sparse_moe.gate, block_sparse_moe.experts.E.{w1,w3,w2} (gate, up, down).
      const bool mixtral = c.architecture == "MixtralForCausalLM";
      const std::string m = p + (mixtral ? "block_sparse_moe." : "mlp.");
      const int64_t u = c.moe.intermediate;
      l.router = b.matrix(m + "gate.weight", c.moe.experts, c.hidden);
      for (int64_t e = 0; e < c.moe.experts; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        l.experts.push_back({b.matrix(x + (mixtral ? "w1" : "gate_proj") + ".weight", u, c.hidden),
                             b.matrix(x + (mixtral ? "w3" : "up_proj") + ".weight", u, c.hidden),
                             b.matrix(x + (mixtral ? "w2" : "down_proj") + ".weight", c.hidden, u)});
      }
    } else {
      l.w_gate = b.matrix(p + "mlp.gate_proj.weight", c.intermediate, c.hidden);
      l.w_up = b.matrix(p + "mlp.up_proj.weight", c.intermediate, c.hidden);
      l.w_down = b.matrix(p + "mlp.down_proj.weight", c.hidden, c.intermediate);
    }
    w->layers.push_back(std::move(l));
  }
  if (panels) {
    w->panels = std::make_unique<PanelStore>();
    PanelStore& s = *w->panels;
    // wo and w_down stay in the mapping: the CPU backend copies them as the
    // column chunks of its fixed reduction tree (runtime/cpu/row_parallel.h).
    for (auto& l : w->layers) {
      for (Matrix* m : {&l.wq, &l.wk, &l.wv, &l.w_gate, &l.w_up, &l.router}) *m = s.pack(*m);
      for (auto& e : l.experts)
        for (Matrix* m : {&e.gate, &e.up}) *m = s.pack(*m);
    }
    w->lm_head = s.pack(w->lm_head);
  }
  return w;
}

}  // namespace tandem::runtime
