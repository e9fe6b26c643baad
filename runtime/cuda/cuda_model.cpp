#include "runtime/cuda/cuda_model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/backoff.h"
#include "common/error.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/tp_group.h"
#include "runtime/cuda/ops.h"
#include "runtime/model/rope.h"

namespace tandem::runtime::cuda {

CudaModel::DevMatrix CudaModel::upload(std::initializer_list<Part> parts, const std::string& what, bool dequantize,
                                       Fp8Gemm* fp8) {
  return upload(std::span<const Part>(parts.begin(), parts.size()), what, dequantize, fp8);
}

namespace {

// Where an 8-bit part's columns fall in its scale blocks: block_cols, and
// the offset of its first column in its block (ops.h ProductScales).
std::pair<int64_t, int64_t> scale_blocks(const Matrix& m, int64_t c0) {
  return {m.scales.block_cols, (c0 + m.scales.c0) % m.scales.block_cols};
}

}  // namespace

CudaModel::DevMatrix CudaModel::upload(std::span<const Part> parts, const std::string& what, bool dequantize,
                                       Fp8Gemm* fp8) {
  DevMatrix d;
  if (parts.empty()) return d;
  const Matrix& first = *parts.begin()->m;
  // 8-bit weights go up as codes with their scales (products() multiplies them, as the CPU: code x scale, then
  // the product), or, dequantized, as their float32 values.
  auto computed = [&](const Matrix& m) { return m.quantized() && dequantize ? DType::kF32 : m.dtype; };
  d.dtype = computed(first);
  auto cols_of = [](const Part& p) { return (p.c1 < 0 ? p.m->cols : p.c1) - p.c0; };
  auto rows_of = [](const Part& p) { return (p.r1 < 0 ? p.m->rows : p.r1) - p.r0; };
  d.cols = cols_of(*parts.begin());
  for (const Part& p : parts) {
    if (p.m->panels) throw Error("internal: the CUDA backend needs row-major weights (load them with panels = false)");
    if (computed(*p.m) != d.dtype || cols_of(p) != d.cols)
      throw Error("the CUDA backend multiplies " + what + " as one product, but their weights differ in dtype or width (" +
                  std::string(dtype_name(first.dtype)) + " vs " + std::string(dtype_name(p.m->dtype)) +
                  "); convert the checkpoint to one dtype");
    if (d.quantized() && scale_blocks(*p.m, p.c0) != scale_blocks(first, parts.begin()->c0))
      throw Error("the CUDA backend multiplies " + what + " as one product, but their scale blocks differ; convert the "
                  "checkpoint to one quantization scheme");
    d.rows += rows_of(p);
  }
  const std::size_t es = dtype_size(d.dtype), row_bytes = static_cast<std::size_t>(d.cols) * es;
  d.data.resize(static_cast<std::size_t>(d.rows) * row_bytes);
  std::vector<float> scale_rows;  // 8-bit: for each row, the scales of the blocks its columns cross
  if (d.quantized()) {
    std::tie(d.scale_cols, d.scale_offset) = scale_blocks(first, parts.begin()->c0);
    d.scale_ld = (d.cols + d.scale_offset + d.scale_cols - 1) / d.scale_cols;
  }
  std::size_t at = 0;
  for (const Part& p : parts) {  // the region, row by row out of the checkpoint's rows
    const auto rows = static_cast<std::size_t>(rows_of(p));
    if (p.m->quantized() && dequantize) {  // a row at a time, dequantized on the host
      std::vector<float> row(static_cast<std::size_t>(p.m->cols));
      for (std::size_t r = 0; r < rows; ++r) {
        const auto n = static_cast<int64_t>(r) + p.r0;
        cpu::dequantize_rows(*p.m, n, n + 1, row.data());
        TANDEM_CUDA_CHECK(cudaMemcpy(d.data.get() + at + r * row_bytes, row.data() + p.c0, row_bytes,
                                     cudaMemcpyHostToDevice));
      }
      at += rows * row_bytes;
      continue;
    }
    if (p.m->quantized())  // block j of the row: its first column's scale (column 0's for the first block)
      for (std::size_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < d.scale_ld; ++j)
          scale_rows.push_back(p.m->scales.at(static_cast<int64_t>(r) + p.r0,
                                              p.c0 + std::max<int64_t>(0, j * d.scale_cols - d.scale_offset)));
    const auto* src = static_cast<const uint8_t*>(p.m->data) + static_cast<std::size_t>(p.r0 * p.m->cols + p.c0) * es;
    TANDEM_CUDA_CHECK(cudaMemcpy2D(d.data.get() + at, row_bytes, src, static_cast<std::size_t>(p.m->cols) * es, row_bytes,
                                   rows, cudaMemcpyHostToDevice));
    at += rows * row_bytes;
  }
  if (!scale_rows.empty()) {
    d.scale_rows.resize(scale_rows.size());
    TANDEM_CUDA_CHECK(cudaMemcpy(d.scale_rows.get(), scale_rows.data(), scale_rows.size() * sizeof(float),
                                 cudaMemcpyHostToDevice));
  }
  if (fp8 && d.dtype == DType::kF8E4M3) {
    upload_blocks(parts, what, d);
    try {  // a shape cuBLASLt has no FP8 algorithm for stops the load, not the first long step of a job
      fp8->prepare(d.blocks.get(), d.blocks_ld, d.rows, d.cols, kDequantRows);
    } catch (const Error& e) {
      throw Error(what + ": " + e.what());
    }
  }
  return d;
}

DeviceBuffer<float> CudaModel::upload(std::initializer_list<const std::vector<float>*> parts) {
  DeviceBuffer<float> d;
  std::vector<float> all;
  for (const auto* v : parts) all.insert(all.end(), v->begin(), v->end());
  if (all.empty()) return d;
  d.resize(all.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(d.get(), all.data(), all.size() * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

CudaModel::CudaModel(const ModelConfig& config, const ModelWeights& w, kv::BlockPool& pool, DeviceGroup* group,
                     bool expert_parallel)
    : group_(group && group->shard().width > 1 ? group : nullptr),
      expert_parallel_(expert_parallel && group_ && config.moe.any()),
      c_(group_ ? cpu::local_config(config, group_->shard(), expert_parallel) : config),
      pool_(pool) {
  // The step buffers of a group's ranks are sized alike (so they move at the same steps): for the widest shard.
  intermediate_room_ = c_.intermediate, moe_intermediate_room_ = c_.moe.intermediate;
  for (int r = 0; group_ && r < group_->shard().width; ++r) {
    const ModelConfig theirs = cpu::local_config(config, {r, group_->shard().width}, expert_parallel);
    intermediate_room_ = std::max(intermediate_room_, theirs.intermediate);
    moe_intermediate_room_ = std::max(moe_intermediate_room_, theirs.moe.intermediate);
  }
  if (pool.layout().elem_bytes != 4 && pool.layout().elem_bytes != 2 && pool.layout().elem_bytes != 1)
    throw Error("internal: the CUDA backend keeps KV in float32, bf16 or FP8, not " +
                std::to_string(pool.layout().elem_bytes) + "-byte elements");
  if (pool.layout().fp8() && config.head_dim % 4 != 0)
    throw Error("kv.dtype = \"fp8\" needs head_dim to be a multiple of 4 (its rows' scales are aligned floats); this "
                "model's is " + std::to_string(config.head_dim) + ": use kv.dtype = \"bf16\"");
  if (config.head_dim > 256 || config.head_dim % 2 != 0)
    throw Error("the CUDA backend's attention takes head_dim up to 256 (even); this model has " +
                std::to_string(config.head_dim) + "; use model.backend = \"cpu\"");
  if (group_) {
    if (const std::string why = cpu::tp_problem(config, group_->shard().width, expert_parallel); !why.empty())
      throw Error(why);
  }
  if (config.moe.any() && config.moe.experts > kMaxExperts)
    throw Error("the CUDA backend routes up to " + std::to_string(kMaxExperts) + " experts; this model has " +
                std::to_string(config.moe.experts) + ": use model.backend = \"cpu\"");
  if (const std::string why = cpu::experts_problem(config); !why.empty()) throw Error(why);
  if (pool.layout().kv_heads != c_.kv_heads)
    throw Error("internal: the KV pool holds " + std::to_string(pool.layout().kv_heads) + " KV heads; this rank computes " +
                std::to_string(c_.kv_heads));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  TANDEM_CUBLAS_CHECK(cublasCreate(&blas_));
  TANDEM_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  // Tensor cores for bf16/f16; float32 products ask for pedantic float32 per call (no TF32).
  TANDEM_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
  // A fixed workspace: cuBLAS must not allocate inside a captured graph.
  workspace_.resize(std::size_t{32} << 20);
  TANDEM_CUBLAS_CHECK(cublasSetWorkspace(blas_, workspace_.get(), workspace_.size()));
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
  sms_ = std::min(sms_, kRoomSms);
  const char* graphs = std::getenv("TANDEM_CUDA_GRAPHS");
  graphs_enabled_ = !(graphs && std::string(graphs) == "0") && (!group_ || group_->graph_safe());
  const char* draw_env = std::getenv("TANDEM_CUDA_DRAW");
  draw_enabled_ = !(draw_env && std::string(draw_env) == "0");
  // Prefill attention on the tensor cores for half-precision models (TANDEM_CUDA_TC_ATTENTION=0: the float32 kernel).
  const char* tc = std::getenv("TANDEM_CUDA_TC_ATTENTION");
  tc_attention_ = w.embed.dtype != DType::kF32 && config.head_dim % 16 == 0 && config.head_dim <= 256 &&
                  !pool.layout().fp8() && !(tc && std::string(tc) == "0");  // FP8 KV: the float32 tiles
  embed_ = upload({{&w.embed}}, "the embedding", /*dequantize=*/true);  // looked up by row: float values
  if (!w.lm_head.data)
    throw Error("the checkpoint has no lm_head (an embedding model); the CUDA backend runs generation models: use "
                "model.backend = \"cpu\"");
  tied_ = w.lm_head.data == w.embed.data;
  if (!tied_) lm_head_ = upload({{&w.lm_head}}, "the LM head");
  final_norm_ = upload({&w.final_norm});
  const std::vector<float> inv_freq = rope_inv_freq(config);
  inv_freq_ = upload({&inv_freq});
  if (config.gpu_matmul == "fp8") {  // job_checks refused it for any other checkpoint
    if (const std::string why = Fp8Gemm::unsupported(); !why.empty())
      throw Error("model.gpu_matmul = \"fp8\": " + why + "; use \"auto\"");
    fp8_ = std::make_unique<Fp8Gemm>(workspace_.get(), workspace_.size());
  }
  upload_layers(config, w);
  // Long products of 8-bit weights on the tensor cores (TANDEM_CUDA_TC_8BIT=0: always products()): room for a
  // tile of the widest such matrix's values (those on the FP8 units need none).
  const char* tc8 = std::getenv("TANDEM_CUDA_TC_8BIT");
  int64_t tile = 0;
  auto room = [&](const DevMatrix& m) {
    if (m.quantized() && !(fp8_ && m.blocks.size())) tile = std::max(tile, std::min(m.rows, dequant_tile_rows(m.cols)) * m.cols);
  };
  for (const DevLayer& l : layers_)
    for (const DevMatrix* m : {&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down}) room(*m);
  room(lm_head_);  // an 8-bit LM head too (tied, it is the embedding's float32 values)
  tc_8bit_ = tile > 0 && !(tc8 && std::string(tc8) == "0");
  if (tc_8bit_) wtile_.resize(static_cast<std::size_t>(tile));
  if (const auto moe_layers = std::count_if(layers_.begin(), layers_.end(), [](const DevLayer& l) { return l.moe_index >= 0; })) {
    expert_counts_.resize(static_cast<std::size_t>(moe_layers * config.moe.experts));
    TANDEM_CUDA_CHECK(cudaMemset(expert_counts_.get(), 0, expert_counts_.size() * sizeof(unsigned long long)));
  }
  // The uploads above (cudaMemcpy from pageable memory may return before its DMA lands) and the zeroing are on
  // the default stream, which stream_ (non-blocking) does not wait for: done before the first step's kernels.
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  // The device holds its copy: the mapping's pages leave this process (a rank keeps its shard, not the file).
  if (w.checkpoint) {
    auto bytes = [](const Matrix& m) { return static_cast<std::size_t>(m.rows * m.cols) * dtype_size(m.dtype); };
    w.checkpoint->release(w.embed.data, bytes(w.embed));
    if (!tied_) w.checkpoint->release(w.lm_head.data, bytes(w.lm_head));
    for (const LayerWeights& lw : w.layers) {
      for (const Matrix* m : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down, &lw.router})
        if (m->data) w.checkpoint->release(m->data, bytes(*m));
      for (const ExpertWeights& e : lw.experts)
        for (const Matrix* m : {&e.gate, &e.up, &e.down})
          if (m->data) w.checkpoint->release(m->data, bytes(*m));
    }
  }
}

// The shard's weights (the whole model without a group): its heads' rows of
// q, k and v, its units' rows of gate and up, its columns of o_proj and
// down_proj; the norms and o_proj's bias whole (the bias is added once, after the group's sum).
void CudaModel::upload_layers(const ModelConfig& full, const ModelWeights& w) {
  const cpu::TpShard s = group_ ? group_->shard() : cpu::TpShard{};
  const cpu::ShardOffsets o = cpu::shard_offsets(full, s);
  const int64_t hd = full.head_dim;
  const int64_t q0 = o.head * hd, q1 = q0 + c_.heads * hd, k0 = o.kv_head * hd, k1 = k0 + c_.kv_heads * hd;
  const int64_t u0 = o.unit, u1 = o.unit + c_.intermediate;
  auto slice = [](const std::vector<float>& v, int64_t a, int64_t b) {
    return v.empty() ? v : std::vector<float>(v.begin() + a, v.begin() + b);
  };
  for (const LayerWeights& lw : w.layers) {
    DevLayer d;
    d.attn_norm = upload({&lw.attn_norm});
    d.mlp_norm = upload({&lw.mlp_norm});
    const std::vector<float> bq = slice(lw.bq, q0, q1), bk = slice(lw.bk, k0, k1), bv = slice(lw.bv, k0, k1);
    d.bqkv = upload({&bq, &bk, &bv}), d.bo = upload({&lw.bo});
    d.q_norm = upload({&lw.q_norm}), d.k_norm = upload({&lw.k_norm});
    Fp8Gemm* fp8 = fp8_.get();  // the 128x128 blocks' scales too
    d.wqkv = upload({{&lw.wq, q0, q1}, {&lw.wk, k0, k1}, {&lw.wv, k0, k1}}, "q, k and v", false, fp8);
    d.wo = upload({{&lw.wo, 0, -1, q0, q1}}, "o_proj", false, fp8);
    if (lw.experts.empty()) {
      d.w_gate_up = upload({{&lw.w_gate, u0, u1}, {&lw.w_up, u0, u1}}, "gate and up", false, fp8);
      d.w_down = upload({{&lw.w_down, 0, -1, u0, u1}}, "down_proj", false, fp8);
    } else {
      upload_moe(full, lw, d);
    }
    layers_.push_back(std::move(d));
  }
}

CudaModel::~CudaModel() {
  drop_graphs();
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaModel::group_sum(float* y, int64_t n) {
  if (!group_) return;
  group_->all_gather(y, gathered_.get(), n, stream_);
  sum_parts(gathered_.get(), group_->shard().width, n, y, stream_);
}

void CudaModel::wait() {
  if (!group_) {
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  // The step holds the group's exchanges, which wait for the other ranks' steps: keep this rank's KV moving,
  // looking again within 100 us (a step takes milliseconds; the host's cores are shared).
  Backoff idle;
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) TANDEM_CUDA_CHECK(e);
    (void)cudaGetLastError();  // "not ready" is recorded as the last error: the next launch check would throw it
    group_->progress();
    idle.idle(100);
  }
}

// Every kernel of a step, from the embeddings to the LM head (lm_head false: a
// follower's, none), on stream_. Reads the step's integers from step_ints_
// (laid out by launch()); the same R and LR always give the same launches and
// addresses (graph capture).
void CudaModel::enqueue_step(int64_t R, int64_t LR, bool lm_head) {
  const auto& L = pool_.layout();
  const int64_t H = c_.hidden;
  const int32_t* d_tokens = step_ints_.get();
  const RowTables rt{d_tokens + R, d_tokens + 2 * R, d_tokens + 3 * R + LR};
  const int32_t* d_logit_rows = d_tokens + 3 * R;
  const PoolShape shape{L.layers, L.kv_heads, L.head_dim, L.block_size,
                        L.fp8() ? DType::kF8E4M3 : L.elem_bytes == 2 ? DType::kBF16 : DType::kF32};
  const float eps = static_cast<float>(c_.rms_norm_eps);
  void* pool = pool_.data();  // float32, bf16 or FP8 elements (shape.kv)
  const auto* null = static_cast<const float*>(nullptr);
  auto or_null = [](const DeviceBuffer<float>& b) { return b.size() ? b.get() : nullptr; };
  embedding(embed_.data.get(), embed_.dtype, d_tokens, R, H, x_.get(), stream_);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const DevLayer& lw = layers_[l];
    // x += the last layer's MLP output (none before the first layer), then the attention norm.
    add_rms_norm(x_.get(), l == 0 ? null : y_.get(), null, lw.attn_norm.get(), R, H, eps, lw.wqkv.input(), act_.get(),
                 stream_);
    gemm(lw.wqkv, act_.get(), R, qkv_.get());
    qkv_rope(qkv_.get(), R, c_.heads, or_null(lw.bqkv), c_.qk_norm ? lw.q_norm.get() : null,
             c_.qk_norm ? lw.k_norm.get() : null, eps, inv_freq_.get(), rt, shape, static_cast<int64_t>(l), pool,
             q_.get(), stream_);
    const AttentionScratch scratch{attn_partial_.get(), attn_counters_.get(), attn_splits_};
    if (n_tiles_ == 0) {  // every row decodes (the graph-captured case)
      attention(q_.get(), R, c_.heads, c_.sliding_window, rt, shape, static_cast<int64_t>(l), pool, attn_.get(), stream_,
                nullptr, scratch);
    } else {  // prefill rows in tiles, the others row by row
      (tc_attention_ ? attention_tiles_tc : attention_tiles)(q_.get(), c_.heads, c_.sliding_window, rt,
                                                            d_tokens + tiles_at_, n_tiles_, shape,
                                                            static_cast<int64_t>(l), pool, attn_.get(), stream_);
      if (n_decode_ > 0)
        attention(q_.get(), n_decode_, c_.heads, c_.sliding_window, rt, shape, static_cast<int64_t>(l), pool,
                  attn_.get(), stream_, d_tokens + tiles_at_ + 2 * n_tiles_, scratch);
    }
    gemm(lw.wo, input_for(lw.wo, attn_.get(), R), R, y_.get());
    group_sum(y_.get(), R * H);
    if (lw.moe_index >= 0) {  // a mixture of experts' layer, on its float32 normed input
      add_rms_norm(x_.get(), y_.get(), or_null(lw.bo), lw.mlp_norm.get(), R, H, eps, DType::kF32, moe_in_.get(), stream_);
      enqueue_moe(lw, R);
      continue;
    }
    add_rms_norm(x_.get(), y_.get(), or_null(lw.bo), lw.mlp_norm.get(), R, H, eps, lw.w_gate_up.input(), act_.get(),
                 stream_);
    gemm(lw.w_gate_up, act_.get(), R, gate_up_.get());
    swiglu(gate_up_.get(), R, c_.intermediate, lw.w_down.input(), act_.get(), stream_);
    gemm(lw.w_down, act_.get(), R, y_.get());
    group_sum(y_.get(), R * H);
  }
  add(x_.get(), y_.get(), R * H, stream_);
  if (LR == 0 || !lm_head) return;
  // Final norm and LM head for the rows that want logits only.
  const DevMatrix& head = tied_ ? embed_ : lm_head_;
  gather_rows(x_.get(), d_logit_rows, LR, H, last_.get(), stream_);
  add_rms_norm(last_.get(), null, null, final_norm_.get(), LR, H, eps, head.input(), act_.get(), stream_);
  gemm(head, act_.get(), LR, logits_.get());
}

void CudaModel::drop_graphs() {
  bool any = false;
  for (auto& [rows, g] : graphs_)
    if (g.exec) {
      cudaGraphExecDestroy(g.exec);
      any = true;
    }
  counts_.dropped += any;
  graphs_.clear();
}

// Uploads the step and enqueues all its kernels; returns how many logits rows it computes (none on a follower,
// head false, whose step is otherwise laid out, sized and captured as its leader's).
int64_t CudaModel::launch(std::span<const SeqChunk> chunks, bool head) {
  const auto& L = pool_.layout();
  const int64_t H = c_.hidden, hd = c_.head_dim, q_dim = c_.heads * hd, kv_dim = c_.kv_heads * hd;
  auto sz = [](int64_t n) { return static_cast<std::size_t>(n); };

  // The step's integers, staged in one pinned buffer and sent in one copy:
  // [tokens R][positions R][table_of R][logit rows LR][tables T].
  std::vector<int32_t> tokens, positions, table_of, logit_rows, tables;
  std::vector<int32_t> tile_first, tile_rows, decode_rows;  // prefill rows in tiles; single-token rows alone
  for (const SeqChunk& ch : chunks) {
    const auto base = static_cast<int64_t>(tokens.size()), n = static_cast<int64_t>(ch.tokens.size());
    if (n == 1) decode_rows.push_back(static_cast<int32_t>(base));
    for (int64_t t0 = 0; n > 1 && t0 < n; t0 += kTileQ) {
      tile_first.push_back(static_cast<int32_t>(base + t0));
      tile_rows.push_back(static_cast<int32_t>(std::min(kTileQ, n - t0)));
    }
    const int64_t end = ch.start_pos + static_cast<int64_t>(ch.tokens.size());
    if (static_cast<int64_t>(ch.block_table.size()) * L.block_size < end) {
      throw Error("internal: a sequence's block table covers " +
                  std::to_string(ch.block_table.size() * static_cast<std::size_t>(L.block_size)) +
                  " positions but the step needs " + std::to_string(end));
    }
    const auto offset = static_cast<int32_t>(tables.size());
    tables.insert(tables.end(), ch.block_table.begin(), ch.block_table.end());
    for (std::size_t t = 0; t < ch.tokens.size(); ++t) {
      const int32_t tok = ch.tokens[t];
      if (tok < 0 || tok >= c_.vocab)
        throw Error("token id " + std::to_string(tok) + " is outside the vocabulary (0.." + std::to_string(c_.vocab - 1) + ")");
      if (ch.logits_all || (ch.logits_last && t + 1 == ch.tokens.size()))
        logit_rows.push_back(static_cast<int32_t>(tokens.size()));
      tokens.push_back(tok);
      positions.push_back(static_cast<int32_t>(ch.start_pos + static_cast<int64_t>(t)));
      table_of.push_back(offset);
    }
  }
  const auto R = static_cast<int64_t>(tokens.size()), LR = static_cast<int64_t>(logit_rows.size());
  if (R == 0) return 0;
  host_ints_.clear();
  for (const auto* v : {&tokens, &positions, &table_of, &logit_rows, &tables})
    host_ints_.insert(host_ints_.end(), v->begin(), v->end());
  // After them: [tile first rows NT][tile row counts NT][decode rows ND] (only when some chunk prefills).
  n_tiles_ = static_cast<int64_t>(tile_first.size());
  n_decode_ = n_tiles_ > 0 ? static_cast<int64_t>(decode_rows.size()) : 0;
  tiles_at_ = static_cast<int64_t>(host_ints_.size());
  if (n_tiles_ > 0)
    for (const auto* v : {&tile_first, &tile_rows, &decode_rows}) host_ints_.insert(host_ints_.end(), v->begin(), v->end());
  pinned_.resize(host_ints_.size());
  std::memcpy(pinned_.get(), host_ints_.data(), host_ints_.size() * sizeof(int32_t));
  // Every buffer a captured graph points at grows (grow: the graphs dropped first) by what every rank of a group
  // knows alike (the step's rows, the widest shard), so that all of them drop their graphs at the same steps.
  grow(step_ints_, static_cast<int64_t>(host_ints_.size()));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(step_ints_.get(), pinned_.get(), host_ints_.size() * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_));
  grow(x_, R * H);
  // The FP8 units write their products' outputs for rows in eights (fp8_product): y_, qkv_ and gate_up_ have room.
  const int64_t Rp = fp8_ ? fp8_scale_ld(R) : R;
  grow(y_, Rp * H);
  grow(qkv_, Rp * (q_dim + 2 * kv_dim));
  grow(q_, R * q_dim);
  grow(attn_, R * q_dim);
  grow(gate_up_, Rp * 2 * intermediate_room_);
  // Sized before the first kernel: growing a buffer mid-step (cudaFree) would wait for the whole device.
  const int64_t widest = std::max({H, q_dim, intermediate_room_});  // a product's input
  grow(act_, R * widest);
  if (tc_8bit_ && R >= kDequantRows) grow(act16_, R * widest);
  if (fp8_ && R >= kDequantRows) {
    grow(act8_, Rp * widest);
    grow(act8_scales_, (widest / kFp8Group + 1) * Rp);
  }
  grow(last_, R * H);
  if (group_) grow(gathered_, group_->shard().width * R * H);
  if (c_.moe.any()) size_moe(R);
  if (head) {
    grow(logits_, LR * c_.vocab);
  } else if (const std::size_t room = grown_size(logits_room_, sz(LR * c_.vocab)); room != logits_room_) {
    drop_graphs();  // no logits here, but the graphs drop where the leader's do, at its logits_ moving
    logits_room_ = room;
  }
  // Decode rows' attention split over positions when they are too few to fill the GPU; its scratch sized for
  // the most splits of any device up to kRoomSms multiprocessors (a group's ranks may differ: MIG slices).
  const int64_t split_rows = n_tiles_ == 0 ? R : n_decode_;
  attn_splits_ = attention_splits(split_rows, c_.heads, sms_);
  const int64_t room_splits = attention_splits(split_rows, c_.heads, kRoomSms);
  if (room_splits > 1) {
    grow(attn_partial_, split_rows * c_.heads * room_splits * (hd + 2));
    if (grow(attn_counters_, split_rows * c_.heads))
      TANDEM_CUDA_CHECK(cudaMemsetAsync(attn_counters_.get(), 0, attn_counters_.size() * sizeof(int32_t), stream_));
  }

  // A decode step (one token per sequence, logits for each) runs as a CUDA
  // graph captured for its batch size: ~10 kernels per layer launched once.
  // Its first step of a size runs eagerly (cuBLAS settles its kernels), the
  // second is captured, later ones replay it. In a group every rank decides
  // alike from the same steps (the leader's LR, the same buffers moving),
  // so each captures and replays the NCCL exchanges with the others.
  const bool decode = LR == R && R <= kMaxGraphRows &&
                      std::all_of(chunks.begin(), chunks.end(), [](const SeqChunk& ch) { return ch.tokens.size() == 1; });
  if (graphs_enabled_ && decode) {
    Graph& g = graphs_[R];
    if (!g.exec && ++g.seen >= 2) {
      cudaGraph_t graph = nullptr;
      TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      try {
        enqueue_step(R, LR, head);
      } catch (...) {  // leave the stream out of capture mode, or every later step fails too
        if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError();  // this failure is reported once, not again by the next step's launch check
        throw;
      }
      cudaError_t made = cudaStreamEndCapture(stream_, &graph);
      if (made == cudaSuccess) made = cudaGraphInstantiate(&g.exec, graph, 0);
      if (graph) cudaGraphDestroy(graph);
      if (made != cudaSuccess) {
        g.exec = nullptr;
        (void)cudaGetLastError();
        TANDEM_CUDA_CHECK(made);
      }
    }
    if (g.exec) {
      TANDEM_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
      ++(g.seen == 2 ? counts_.captured : counts_.replayed);
      g.seen = 3;  // captured: later launches replay
      return head ? LR : 0;
    }
  }
  enqueue_step(R, LR, head);
  ++counts_.eager;
  return head ? LR : 0;
}

void CudaModel::forward(std::span<const SeqChunk> chunks, std::vector<float>& logits) {
  const int64_t LR = launch(chunks);
  logits.resize(static_cast<std::size_t>(LR * c_.vocab));
  if (LR == 0) {
    wait();
    return;
  }
  pinned_logits_.resize(logits.size());
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(pinned_logits_.get(), logits_.get(), logits.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                    stream_));
  wait();  // the step's one wait: its logits
  std::memcpy(logits.data(), pinned_logits_.get(), logits.size() * sizeof(float));
}

void CudaModel::forward_follower(std::span<SeqChunk> chunks, std::vector<float>& scratch) {
  scratch.clear();
  launch(chunks, /*head=*/false);
  wait();
}

void CudaModel::reserve_tokens(std::size_t rows) {
  argmax_out_.resize(std::max<std::size_t>(1, rows));
  pinned_tokens_.resize(rows);
}

// Through page-locked memory: a copy into pageable memory would hold the host
// until the step is done, and a rank of a group must move its KV meanwhile (wait()).
void CudaModel::tokens_to_host(int64_t rows, std::vector<int32_t>& tokens) {
  tokens.resize(static_cast<std::size_t>(rows));
  if (rows > 0)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(pinned_tokens_.get(), argmax_out_.get(), tokens.size() * sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, stream_));
  wait();  // the step's one wait: its tokens
  if (rows > 0) std::memcpy(tokens.data(), pinned_tokens_.get(), tokens.size() * sizeof(int32_t));
}

bool CudaModel::forward_argmax(std::span<const SeqChunk> chunks, std::vector<int32_t>& tokens) {
  // Sized before the step's kernels: growing a buffer (cudaFree) would wait for the whole device.
  std::size_t rows = 1;
  for (const SeqChunk& ch : chunks) rows += ch.logits_all ? ch.tokens.size() : ch.logits_last && !ch.tokens.empty();
  reserve_tokens(rows);
  const int64_t LR = launch(chunks);
  if (LR > 0) argmax(logits_.get(), LR, c_.vocab, argmax_out_.get(), stream_);
  tokens_to_host(LR, tokens);
  return true;
}

bool CudaModel::forward_draw(std::span<const SeqChunk> chunks, std::span<const DeviceDraw> draws,
                             std::vector<int32_t>& tokens) {
  if (!draw_enabled_) return false;
  // Sized before the step's kernels: growing a buffer (cudaFree) would wait for the whole device.
  pinned_draws_.resize(draws.size());
  draw_params_.resize(std::max<std::size_t>(1, draws.size()));
  reserve_tokens(draws.size());
  const int64_t LR = launch(chunks);
  if (LR != static_cast<int64_t>(draws.size()))
    throw Error("internal: " + std::to_string(draws.size()) + " draws for " + std::to_string(LR) + " logits rows");
  if (LR > 0) {
    for (std::size_t i = 0; i < draws.size(); ++i)
      pinned_draws_.get()[i] = DrawParams{draws[i].temperature, draws[i].min_p, draws[i].u};
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(draw_params_.get(), pinned_draws_.get(), draws.size() * sizeof(DrawParams),
                                      cudaMemcpyHostToDevice, stream_));
    draw(logits_.get(), LR, c_.vocab, draw_params_.get(), argmax_out_.get(), stream_);
  }
  tokens_to_host(LR, tokens);
  return true;
}

}  // namespace tandem::runtime::cuda
