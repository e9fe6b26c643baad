#include "runtime/model/weights.h"

#include "common/error.h"

namespace tandem::runtime {
namespace {

struct Binder {
  const Checkpoint& ckpt;
  const ModelConfig& config;
  std::string dir;

  const TensorView& get(const std::string& name, std::vector<int64_t> shape) const {
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
    return Matrix{t.data, t.dtype, rows, cols};
  }
  std::vector<float> vector(const std::string& name, int64_t n) const {
    const TensorView& t = get(name, {n});
    std::vector<float> v(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = load_as_f32(t.data, t.dtype, static_cast<std::size_t>(i));
    return v;
  }
};

}  // namespace

std::unique_ptr<ModelWeights> ModelWeights::load(const ModelConfig& c, const std::filesystem::path& model_dir) {
  auto w = std::make_unique<ModelWeights>();
  w->checkpoint = Checkpoint::open(model_dir);
  const Binder b{*w->checkpoint, c, model_dir.string()};
  const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
  w->embed = b.matrix("model.embed_tokens.weight", c.vocab, c.hidden);
  if (c.tie_embeddings && !w->checkpoint->find("lm_head.weight")) w->lm_head = w->embed;
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
    l.w_gate = b.matrix(p + "mlp.gate_proj.weight", c.intermediate, c.hidden);
    l.w_up = b.matrix(p + "mlp.up_proj.weight", c.intermediate, c.hidden);
    l.w_down = b.matrix(p + "mlp.down_proj.weight", c.hidden, c.intermediate);
    w->layers.push_back(std::move(l));
  }
  return w;
}

}  // namespace tandem::runtime
