// The decoder forward pass on one CUDA device, behind the same interface as
// the CPU reference (runtime/engine/backend.h) and the same steps in the same
// order (see cpu/cpu_model.h): embeddings, then per layer RMSNorm -> q, k, v
// (cuBLAS) -> q/k norm -> RoPE -> K, V into the paged pool -> attention ->
// o_proj -> residual -> RMSNorm -> SwiGLU MLP -> residual; then the final
// norm and the LM head for the rows that want logits.
//
// Fewer, larger kernels, since a small decode step is bound by launches, not
// bytes: q, k and v are one product over their weights concatenated (so are
// gate and up), everything from that product to the pool is one kernel
// (qkv_rope), each residual add runs with the norm after it, and the norm and
// SwiGLU write their results in the type of the next product. A layer is 10
// kernels (plus cuBLAS's), where it was 22.
//
// The KV pool holds float32, bf16 or FP8 elements (its layout's elem_bytes;
// kv.dtype; FP8 rows as the CPU writes them): attention reads any,
// accumulating in float32. A mixture of experts' layers and 8-bit weights
// (kept 8-bit, with their scales) are multiplied by ops.h products(), not
// cuBLAS (cuda_moe.cpp, products.cu) — except a dense product of 8-bit
// weights over kDequantRows rows or more (a prefill), which turns the
// weights' values into bf16 a tile at a time and runs on the tensor cores
// (or, with model.gpu_matmul = "fp8", quantizes its input and runs on
// Hopper's FP8 tensor cores: fp8_gemm.h; all of it in cuda_products.cpp).
// Weights are copied to the device in their checkpoint dtype. Products run
// in cuBLAS with float32 accumulation: float32 weights in pedantic float32
// (no TF32), bf16/f16 weights on the tensor cores with the activations
// rounded to the weights' type first — where the CPU multiplies float32
// activations, so bf16 results are close to the CPU's, not equal (float32
// checkpoints are the ones the tests hold to equal greedy tokens). Everything of a step is enqueued on one stream;
// the host waits once, for the logits. The pool's memory must be device
// memory (device_pool.h).
//
// In a tensor-parallel group (runtime/engine/device_group.h) the model is
// this rank's shard, cut as the CPU's (runtime/cpu/tp_group.h): its heads'
// rows of q, k and v and its units' rows of gate and up (column-parallel),
// its columns of o_proj and down_proj (row-parallel); the embedding, the
// norms and the LM head whole. Only the shard is copied to the device. After
// each row-parallel product the group gathers the ranks' partial sums on the
// device and every rank adds them in rank order in the fixed tree
// (sum_parts), so every rank holds the same hidden state. Unlike the CPU's,
// the CUDA outputs are not the same bits at every width: cuBLAS picks its
// kernels by the product's shape, which the width changes (docs/engine.md).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/fp8_gemm.h"
#include "runtime/cuda/ops.h"
#include "runtime/engine/backend.h"
#include "runtime/engine/device_group.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"

namespace tandem::runtime::cuda {

class CudaModel final : public ModelBackend {
 public:
  // Uses the current device. weights must be row-major (ModelWeights::load
  // with panels = false); weights, pool and group must outlive the model.
  // With a group of width > 1 the pool holds the shard's KV heads (cpu::shard_config).
  // A mixture of experts' layers are expert-parallel in a group (each rank
  // holds E / width whole experts; expert_parallel false splits every expert's
  // units as the dense MLP's), as the CPU's (cpu/expert_parallel.h).
  CudaModel(const ModelConfig& config, const ModelWeights& weights, kv::BlockPool& pool, DeviceGroup* group = nullptr,
            bool expert_parallel = true);
  ~CudaModel() override;
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  std::string_view name() const override { return "cuda"; }
  // A dense product of 8-bit weights over this many rows or more (a prefill) runs on the tensor cores, the
  // weights' values rounded to bf16 (TANDEM_CUDA_TC_8BIT=0: never); fewer rows are bound by the weights'
  // bytes, which products() reads once, a byte each, multiplying code x scale in float32 as the CPU does.
  static constexpr int64_t kDequantRows = 64;
  // Decode steps as captured graphs (default; TANDEM_CUDA_GRAPHS=0 starts without).
  void use_graphs(bool on) {
    graphs_enabled_ = on;
    if (!on) drop_graphs();
  }
  void forward(std::span<const SeqChunk> chunks, std::vector<float>& logits) override;
  // The step as the leader lays it out (its rows wanting logits included: the same buffers, moving at the same
  // steps, and the same decode steps captured as graphs, as NCCL asks of every rank), without the LM head.
  void forward_follower(std::span<SeqChunk> chunks, std::vector<float>& scratch) override;
  // The greedy tokens picked on the device: LR int32 to the host instead of LR x vocab floats.
  bool forward_argmax(std::span<const SeqChunk> chunks, std::vector<int32_t>& tokens) override;
  // Greedy and plain-temperature rows drawn on the device (draw.cu); TANDEM_CUDA_DRAW=0 turns it off.
  bool forward_draw(std::span<const SeqChunk> chunks, std::span<const DeviceDraw> draws,
                    std::vector<int32_t>& tokens) override;
  bool has_argmax() const override { return true; }
  std::vector<int64_t> expert_tokens() const override;
  int expert_ranks() const override { return expert_parallel_ ? group_->shard().width : 1; }
  bool has_draw() const override { return draw_enabled_; }
  // What became of the steps (a group's ranks must show the same: NCCL's captures are collective): steps launched
  // kernel by kernel, decode steps captured as graphs and replayed, and the times captured graphs were dropped.
  struct GraphCounts {
    int64_t eager = 0, captured = 0, replayed = 0, dropped = 0;
    bool operator==(const GraphCounts&) const = default;
  };
  GraphCounts graph_counts() const { return counts_; }

 private:
  struct DevMatrix {
    DeviceBuffer<uint8_t> data;  // [rows][cols] of dtype
    DType dtype = DType::kF32;
    int64_t rows = 0, cols = 0;
    // 8-bit codes' scales, a row of them per row (ops.h ProductScales); products() multiplies these, not cuBLAS.
    DeviceBuffer<float> scale_rows;
    int64_t scale_ld = 1, scale_cols = 1, scale_offset = 0;
    bool quantized() const { return dtype == DType::kF8E4M3 || dtype == DType::kI8; }
    // The type a product with it takes its input in: float32 for 8-bit and float32 weights, else theirs.
    DType input() const { return quantized() ? DType::kF32 : dtype; }
    ProductScales scales() const {
      return quantized() ? ProductScales{scale_rows.get(), scale_ld, scale_cols, scale_offset} : ProductScales{};
    }
    // model.gpu_matmul = "fp8": the checkpoint's 128x128 blocks' scales [ceil(rows / 128)][blocks_ld] (fp8_gemm.h).
    DeviceBuffer<float> blocks;
    int64_t blocks_ld = 0;
  };
  struct DevLayer {
    DeviceBuffer<float> attn_norm, bqkv, bo, q_norm, k_norm, mlp_norm;  // bqkv: [bq | bk | bv]
    DevMatrix wqkv, wo, w_gate_up, w_down;                               // wqkv: rows of wq, wk, wv; w_gate_up: w_gate, w_up
    // A MoE layer's (no w_gate_up, w_down): the router whole; this rank's
    // experts one after another, each [gate units; up units][hidden] and [hidden][units].
    DevMatrix router, experts_gate_up, experts_down;
    int64_t moe_index = -1;  // among the MoE layers (-1: a dense layer)
  };
  // Rows [r0, r1) and columns [c0, c1) of a row-major matrix (the whole of it by default).
  struct Part {
    const Matrix* m = nullptr;
    int64_t r0 = 0, r1 = -1, c0 = 0, c1 = -1;
  };
  // The parts one below the other, as one product ([sum of rows][cols]); `what` names them in errors.
  // 8-bit weights stay 8-bit, with a row of scales per row; dequantize: as their float32 values (the embedding).
  // fp8 (model.gpu_matmul = "fp8"): FP8 weights get their 128x128 blocks' scales too (DevMatrix::blocks) and its
  // algorithm for their shape (Fp8Gemm::prepare), or it throws.
  static DevMatrix upload(std::initializer_list<Part> parts, const std::string& what, bool dequantize = false,
                          Fp8Gemm* fp8 = nullptr);
  static DevMatrix upload(std::span<const Part> parts, const std::string& what, bool dequantize = false,
                          Fp8Gemm* fp8 = nullptr);
  // The parts' 128x128 blocks' scales, block row by block row (fp8_gemm.h), into d.
  static void upload_blocks(std::span<const Part> parts, const std::string& what, DevMatrix& d);
  static DeviceBuffer<float> upload(std::initializer_list<const std::vector<float>*> parts);
  void upload_layers(const ModelConfig& full, const ModelWeights& w);
  // A MoE layer's router and this rank's experts (cuda_moe.cpp).
  void upload_moe(const ModelConfig& full, const LayerWeights& lw, DevLayer& d);
  // Its MLP over xn (R rows, float32) into y_: route, group by expert, the
  // experts' products, the group's exchange, the combine (cuda_moe.cpp).
  void enqueue_moe(const DevLayer& lw, int64_t R);
  // Its step buffers for R rows (grow).
  void size_moe(int64_t R);
  // After a row-parallel product into y (rows x n floats): the group's sum of every rank's y, on every rank.
  void group_sum(float* y, int64_t n);
  // The host waits for the step's stream (moving the rank's KV on meanwhile, in a group).
  void wait();
  // Room for `rows` tokens drawn on the device (before the step's kernels); then the step's tokens to the host.
  void reserve_tokens(std::size_t rows);
  void tokens_to_host(int64_t rows, std::vector<int32_t>& tokens);
  // x as the products with w take it: itself (float32 weights) or rounded to w's type in act_.
  const void* input_for(const DevMatrix& w, const float* x, int64_t rows);
  // y[rows][w.rows] = x[rows][w.cols] * W^T, float32 out; x from input_for.
  void gemm(const DevMatrix& w, const void* x, int64_t rows, float* y);
  // The same by ops.h products() on float32 x, in a fixed order (8-bit weights; a MoE layer's router).
  void product(const DevMatrix& w, const float* x, int64_t rows, float* y);
  // 8-bit w on the tensor cores: x rounded to bf16, W's values (code x scale) rounded to bf16 a tile of rows
  // at a time (wtile_), cuBLAS's bf16 product of each tile, float32 out.
  void dequantized_gemm(const DevMatrix& w, const float* x, int64_t rows, float* y);
  // model.gpu_matmul = "fp8": x quantized per row and 128 columns, W's codes and blocks on the FP8 tensor cores.
  void fp8_product(const DevMatrix& w, const float* x, int64_t rows, float* y);
  // Rows of an 8-bit matrix of `cols` columns dequantized at once: kDequantTileBytes of bf16, in 128s.
  static int64_t dequant_tile_rows(int64_t cols);
  // cuBLAS's y (ldy floats a row) = x W^T for W [n][k] of type t (row-major; x rows of k of type t).
  void blas_gemm(const void* w, cudaDataType_t t, cublasComputeType_t compute, int64_t n, int64_t k, const void* x,
                 int64_t rows, float* y, int64_t ldy);

  // head false: a group's follower (forward_follower).
  int64_t launch(std::span<const SeqChunk> chunks, bool head = true);
  void enqueue_step(int64_t rows, int64_t logit_rows, bool lm_head);
  void drop_graphs();
  // A step buffer grown to hold n (resize), the graphs dropped before the old memory goes (they point at it, and
  // NCCL keeps a captured buffer registered until its graph goes); true where it moved.
  template <class T>
  bool grow(DeviceBuffer<T>& b, int64_t n) {
    if (static_cast<std::size_t>(n) <= b.size()) return false;
    drop_graphs();
    return b.resize(static_cast<std::size_t>(n));
  }

  static constexpr int64_t kMaxGraphRows = 256;  // decode batch sizes captured as graphs
  static constexpr int kRoomSms = 1024;          // split attention's scratch is sized for this many multiprocessors
  struct Graph {
    int seen = 0;
    cudaGraphExec_t exec = nullptr;
  };

  DeviceGroup* group_ = nullptr;  // null, or a group of width > 1
  const bool expert_parallel_;    // a MoE model in a group, experts whole on their ranks
  const ModelConfig c_;           // this rank's shard of the model (the whole model without a group)
  kv::BlockPool& pool_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  DevMatrix embed_, lm_head_;
  bool tied_ = false;  // the LM head is the embedding
  DeviceBuffer<float> final_norm_, inv_freq_;
  std::vector<DevLayer> layers_;

  // Step buffers.
  DeviceBuffer<float> x_, y_, qkv_, q_, attn_, gate_up_, last_, logits_;  // y_: a product to add to x_
  DeviceBuffer<float> act_;             // a product's input: float32, or bf16/f16 in its first half
  bool tc_8bit_ = false;                // 8-bit weights, long products on the tensor cores (TANDEM_CUDA_TC_8BIT=0: never)
  DeviceBuffer<uint16_t> act16_;        // their input rounded to bf16 [rows][widest]
  DeviceBuffer<uint16_t> wtile_;        // a tile of their weights' values as bf16 (dequant_tile_rows)
  std::unique_ptr<Fp8Gemm> fp8_;        // model.gpu_matmul = "fp8": long products of FP8 blocks on Hopper's FP8 units
  DeviceBuffer<uint8_t> act8_;          // their input as E4M3 codes [rows][widest]
  DeviceBuffer<float> act8_scales_;     // and scales (ops.h quantize_groups_fp8)
  DeviceBuffer<float> gathered_;        // in a group: every rank's partial sums, [width][rows][hidden]
                                        // (a MoE layer's: every slot's, or with expert parallelism every
                                        // rank's slots of this rank's home rows)
  // A MoE layer's: the normed input [rows][hidden] in float32; the router's
  // logits [rows][experts]; each row's experts and weights [rows][top_k]; the
  // slots grouped by expert (ops.h RowGroups); gate|up of each position
  // [rows * top_k][2 units]; each slot's expert output [rows * top_k][hidden].
  DeviceBuffer<float> moe_in_, router_logits_, route_weight_, moe_gate_up_, slot_out_;
  DeviceBuffer<float> moe_home_;  // expert parallelism: this rank's home rows combined [ceil(rows / width)][hidden]
  DeviceBuffer<int32_t> route_expert_, moe_order_, moe_offsets_, moe_tiles_;
  DeviceBuffer<unsigned long long> expert_counts_;  // [MoE layer][expert]: slots routed so far
  int64_t first_expert_ = 0, local_experts_ = 0;   // this rank's experts
  DeviceBuffer<float> attn_partial_;    // decode attention split over positions (ops.h AttentionScratch)
  DeviceBuffer<int32_t> attn_counters_;
  int64_t attn_splits_ = 1;             // this step's
  int sms_ = 1;                         // the device's multiprocessors
  DeviceBuffer<uint8_t> workspace_;     // cuBLAS's
  bool graphs_enabled_ = true;          // TANDEM_CUDA_GRAPHS=0: every step launched kernel by kernel
  bool tc_attention_ = false;           // prefill attention on the tensor cores (bf16/f16 models)
  std::unordered_map<int64_t, Graph> graphs_;  // by batch size
  std::size_t logits_room_ = 0;         // a follower: the elements the leader's logits_ holds (grown_size)
  int64_t intermediate_room_ = 0;       // the group's widest shard of the MLP (shards differ by a unit or so)
  int64_t moe_intermediate_room_ = 0;   // and of an expert's (split across the ranks without expert parallelism)
  GraphCounts counts_;
  DeviceBuffer<int32_t> step_ints_;     // tokens, positions, table_of, logit rows, tables
  DeviceBuffer<int32_t> argmax_out_;    // [logit rows]
  DeviceBuffer<DrawParams> draw_params_;  // [logit rows]
  PinnedBuffer<DrawParams> pinned_draws_;  // staging for draw_params_
  bool draw_enabled_ = true;
  std::vector<int32_t> host_ints_;
  int64_t n_tiles_ = 0, n_decode_ = 0, tiles_at_ = 0;  // this step's prefill tiles (see launch())
  PinnedBuffer<int32_t> pinned_;         // staging for step_ints_
  PinnedBuffer<float> pinned_logits_;
  PinnedBuffer<int32_t> pinned_tokens_;  // staging for argmax_out_
};

}  // namespace tandem::runtime::cuda
