// The decoder forward pass on the CPU over one engine step: a batch that mixes
// prefill chunks and decode tokens of many sequences, reading and writing a
// paged, block-major KV pool.
//
// Per layer, for all rows at once: RMSNorm -> q, k, v (+bias) -> (Qwen3: q/k
// RMSNorm per head) -> RoPE -> K, V into the pool -> causal attention of each
// row over its sequence's pool blocks -> o_proj -> residual -> RMSNorm ->
// SwiGLU MLP -> residual (a mixture of experts' layer: the router, each
// row's top-k experts, their outputs summed in the row's slot order) -> residual.
// Then the final norm and the LM head, only for rows
// that want logits. Every row's result is bitwise the same whatever else is
// in the step (see kernels.h): that is what makes outputs reproducible across
// batch sizes, chunk sizes, ranks and modes.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kv/block_pool.h"
#include "runtime/engine/backend.h"
#include "runtime/cpu/expert_parallel.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/row_parallel.h"
#include "runtime/cpu/tp_group.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"

namespace tandem::runtime::cpu {

using runtime::SeqChunk;

class CpuModel final : public ModelBackend {
 public:
  // config, weights and pool must outlive the model. With a tensor-parallel
  // group (tp_group.h) this rank computes its shard: the pool holds only its
  // KV heads (shard_config), and the weights are best loaded without panels
  // so that only the shard's slices are copied (the rest stays unread in the
  // mapping). A mixture of experts' layers are expert-parallel in a group
  // (expert_parallel.h): each rank holds E / width whole experts; with
  // expert_parallel false every expert is split as the dense MLP is.
  CpuModel(const ModelConfig& config, const ModelWeights& weights, kv::BlockPool& pool, ThreadPool& threads,
           TpGroup* group = nullptr, bool expert_parallel = true);

  // Runs one step. logits: [rows wanting logits][vocab], in chunk order, and
  // within a chunk in position order. Throws tandem::Error on a block table
  // too short for the positions it must hold.
  void forward(std::span<const SeqChunk> chunks, std::vector<float>& logits) override;
  std::string_view name() const override { return "cpu"; }
  bool hidden_rows(std::vector<float>& rows) override {
    rows.swap(hidden_out_);  // the next forward fills hidden_out_ anew
    return true;
  }
  bool has_hidden_rows() const override { return true; }
  bool has_lm_head() const override { return lm_head_.data != nullptr; }
  std::vector<int64_t> expert_tokens() const override { return expert_tokens_; }
  int expert_ranks() const override { return expert_parallel_ ? split_.width : 1; }

  const KernelTable& kernels() const { return kern_; }

 private:
  struct Product {
    const Matrix* w;
    float* y;                         // [rows][w->rows]
    const std::vector<float>* bias;   // [w->rows] or null
  };
  // y = x W^T (+ bias) for every product, all in one pass over the threads
  // (one wake-up instead of one per matrix: decode steps are short).
  void matmul(const float* x, int64_t rows, std::initializer_list<Product> products);
  // The same for a row-parallel product (o_proj, down_proj): W's reduction
  // in its fixed tree of column chunks (row_parallel.h), this rank's chunks,
  // then the group's exchange, so that a tensor-parallel group of any width
  // computes it bit for bit alike. exchange false: this rank's chunks only
  // (the caller exchanges, once for many products).
  void row_parallel(const float* x, int64_t rows, const std::vector<Matrix>& parts, float* y,
                    const std::vector<float>* bias, bool exchange = true);
  void shard_layers(const ModelConfig& full, const ModelWeights& weights);
  void rms_norm(const float* x, const std::vector<float>& w, int64_t n, float* y) const;
  // A MoE layer's MLP on xn_ (R rows), added into x_: each row's top-k
  // experts, each expert over the rows that chose it (its weights read once
  // a step), each row's outputs summed in its slot order: the same bits
  // whatever the batch.
  void moe(int64_t layer, int64_t rows);
  void attention(int64_t layer, std::span<const SeqChunk> chunks);
  void attention_on_tiles(int64_t layer, std::span<const SeqChunk> chunks);  // where the table has attend
  void rows_in_pieces(int64_t rows, const std::function<void(int64_t, int64_t)>& f);
  // KV in the pool's element type (kv.dtype): float32, or bf16 rounded as
  // vcvtneps2bf16 rounds (f32_to_bf16_flushed: what bf16-amx attention makes
  // of float32 KV), which halves the pool and every KV transfer,
  // or FP8 E4M3 with a scale per row (kernels.h's quantize_fp8_row), which
  // halves it again; attention widens FP8 rows to float32 values first.
  const void* kv_at(int64_t element) const;
  // The K and V rows of KV head g in `layer` at positions [from, to] of the chunk's sequence, into keys[j - from]
  // and values[j - from]: one offset a block (its rows are consecutive), not one a position.
  void kv_rows(const SeqChunk& ch, int64_t layer, int64_t g, int64_t from, int64_t to, const void** keys,
               const void** values) const;
  void store_kv(const float* src, int64_t n, int64_t element);

  TpGroup* group_;
  const bool expert_parallel_;  // a MoE model in a group of two or more, experts whole on their ranks
  const ModelConfig c_;  // this rank's shard of the model (the whole model without a group)
  const ModelWeights& w_;
  std::vector<LayerWeights> layers_;  // the shard's slices (views where no copy is needed)
  Matrix lm_head_;                    // replicated on every rank of a group
  kv::BlockPool& pool_;
  ThreadPool& threads_;
  const KernelTable& kern_;
  std::vector<float> inv_freq_;  // [head_dim / 2], RoPE frequencies after scaling
  DType kv_dtype_;               // the pool's elements (kF8E4M3: rows with their scales)
  std::vector<float> hidden_out_;  // the last forward's hidden_rows()
  PanelStore parts_;             // owns the chunks below
  std::vector<std::vector<Matrix>> wo_parts_, down_parts_;  // per layer, the reduction's column chunks
  std::vector<std::vector<std::vector<Matrix>>> expert_down_parts_;  // per layer, per expert (MoE layers)

  // Step buffers, [rows][width].
  std::vector<float> x_, xn_, q_, kbuf_, vbuf_, attn_, gate_, up_;
  std::vector<float> cos_, sin_;  // [rows][head_dim / 2]
  // MoE: router probabilities [rows][experts]; each row's experts and weights [rows][top_k]; an
  // expert's rows gathered, its gate/up and output; every (row, slot)'s output [rows][top_k][hidden].
  std::vector<float> probs_, route_weight_, xe_, ge_, ue_, ye_, slot_out_;
  std::vector<int32_t> route_expert_;
  std::vector<int64_t> expert_tokens_;  // [MoE layer][expert]: rows routed so far
  std::vector<int64_t> moe_index_;      // per layer: its index among the MoE layers (-1: dense)
  std::vector<std::vector<int64_t>> expert_slots_;  // per expert: row * top_k + slot
  ExpertSplit split_;                                // which experts are this rank's (expert_parallel_)
  CombinePlan combine_;                              // the step's exchange of expert outputs
  CombineBuffers combine_bufs_;                      // its buffers and where each slot is written and read
  std::vector<float> moe_out_;                       // the combined rows [home rows][hidden]
  struct RowRef {
    int64_t chunk;
    int64_t pos;
  };
  std::vector<RowRef> rows_;
  // Attention work items: rows [r0, r1) of one chunk x heads [h0, h1) of one KV head.
  struct QueryBlock {
    int64_t r0, r1, h0, h1;
  };
  std::vector<QueryBlock> query_blocks_;
};

}  // namespace tandem::runtime::cpu
