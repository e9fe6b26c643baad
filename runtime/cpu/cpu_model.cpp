#include "runtime/cpu/cpu_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/error.h"
#include "runtime/model/rope.h"
#include "runtime/model/safetensors.h"

namespace tandem::runtime::cpu {

CpuModel::CpuModel(const ModelConfig& config, const ModelWeights& weights, kv::BlockPool& pool, ThreadPool& threads,
                   TpGroup* group, bool expert_parallel)
    : group_(group),
      expert_parallel_(expert_parallel && group && group->shard().width > 1 && config.moe.any()),
      c_(group ? local_config(config, group->shard(), expert_parallel) : config),
      w_(weights),
      pool_(pool),
      threads_(threads),
      kern_(cpu::kernels()),
      inv_freq_(rope_inv_freq(config)),
      kv_dtype_(pool.layout().elem_bytes == 2   ? DType::kBF16
                : pool.layout().elem_bytes == 1 ? DType::kF8E4M3
                                                : DType::kF32) {
  if (pool.layout().elem_bytes != 4 && pool.layout().elem_bytes != 2 && pool.layout().elem_bytes != 1)
    throw Error("the CPU backend keeps KV in float32, bf16 or fp8, not " + std::to_string(8 * pool.layout().elem_bytes) +
                "-bit elements");
  if (pool.layout().fp8() && pool.layout().head_dim % 4 != 0)
    throw Error("kv.dtype = \"fp8\" needs head_dim to be a multiple of 4 (its rows' scales are aligned floats); this "
                "model's is " + std::to_string(pool.layout().head_dim) + ": use kv.dtype = \"bf16\"");
  if (group) {
    const std::string why = tp_problem(config, group->shard().width, expert_parallel);
    if (!why.empty()) throw Error(why);
  }
  if (const std::string why = experts_problem(config); !why.empty()) throw Error(why);
  if (pool.layout().kv_heads != c_.kv_heads)
    throw Error("the KV pool holds " + std::to_string(pool.layout().kv_heads) + " KV heads; this rank computes " +
                std::to_string(c_.kv_heads));
  if (expert_parallel_) split_ = {group->shard().rank, group->shard().width, config.moe.experts};
  shard_layers(config, weights);
  lm_head_ = weights.lm_head.panels ? weights.lm_head : parts_.pack(weights.lm_head);
  if (weights.checkpoint && lm_head_.data != weights.lm_head.data)  // copied: the mapping's pages may go (the
    weights.checkpoint->release(weights.lm_head.data,                // embedding's rows come back as they are read)
                                static_cast<std::size_t>(weights.lm_head.rows * weights.lm_head.cols) *
                                    dtype_size(weights.lm_head.dtype));
  for (int64_t l = 0, k = 0; l < c_.layers; ++l) moe_index_.push_back(c_.moe.at(l) ? k++ : -1);
  expert_tokens_.assign(static_cast<std::size_t>(std::count_if(moe_index_.begin(), moe_index_.end(), [](int64_t i) {
                          return i >= 0;
                        }) * c_.moe.experts),
                        0);
}

namespace {

// Rows [a, b) of m: a view where the layout allows (row-major; panels from a
// whole panel on), else a copy; packed into panels when m was not.
Matrix rows_of(const Matrix& m, int64_t a, int64_t b, PanelStore& store) {
  if (a == 0 && b == m.rows) return m.panels ? m : store.pack(m);
  if (m.panels && a % 8 != 0) return store.pack_slice(m, a, b, 0, m.cols);  // a panel split between ranks
  const Matrix v = m.row_view(a, b);
  return m.panels ? v : store.pack(v);
}

std::vector<float> slice(const std::vector<float>& v, int64_t a, int64_t b) {
  if (v.empty()) return v;
  return {v.begin() + a, v.begin() + b};
}

}  // namespace

// The shard's weights: its heads' rows of q, k and v, its units' rows of
// gate and up, its chunks of o_proj's and down_proj's columns; the norms and
// o_proj's bias whole.
void CpuModel::shard_layers(const ModelConfig& full, const ModelWeights& weights) {
  const TpShard s = group_ ? group_->shard() : TpShard{};
  const ShardOffsets o = shard_offsets(full, s);
  const int64_t hd = full.head_dim;
  const int per = kReduceChunks / s.width;
  for (const LayerWeights& lw : weights.layers) {
    LayerWeights l = lw;
    const int64_t q0 = o.head * hd, q1 = q0 + c_.heads * hd, k0 = o.kv_head * hd, k1 = k0 + c_.kv_heads * hd;
    const int64_t u0 = o.unit, u1 = o.unit + c_.intermediate;
    l.wq = rows_of(lw.wq, q0, q1, parts_);
    l.wk = rows_of(lw.wk, k0, k1, parts_);
    l.wv = rows_of(lw.wv, k0, k1, parts_);
    l.bq = slice(lw.bq, q0, q1);
    l.bk = slice(lw.bk, k0, k1);
    l.bv = slice(lw.bv, k0, k1);
    wo_parts_.push_back(split_columns(lw.wo, s.rank * per, per, parts_));
    std::vector<std::vector<Matrix>> experts;
    if (!lw.experts.empty()) {  // a MoE layer: the router whole, and this rank's experts or share of each
      l.router = rows_of(lw.router, 0, lw.router.rows, parts_);
      const int64_t e0 = o.expert_unit, e1 = e0 + c_.moe.intermediate;
      for (std::size_t e = 0; e < l.experts.size(); ++e) {
        auto& ex = l.experts[e];
        if (expert_parallel_ && !split_.owns(static_cast<int64_t>(e))) {  // another rank's: not kept
          ex = ExpertWeights{};
          experts.emplace_back();
          continue;
        }
        const bool whole = expert_parallel_ || s.width == 1;
        ex.gate = rows_of(ex.gate, whole ? 0 : e0, whole ? ex.gate.rows : e1, parts_);
        ex.up = rows_of(ex.up, whole ? 0 : e0, whole ? ex.up.rows : e1, parts_);
        experts.push_back(whole ? split_columns(ex.down, 0, kReduceChunks, parts_)
                                : split_columns(ex.down, s.rank * per, per, parts_));
      }
      down_parts_.emplace_back();
    } else {
      l.w_gate = rows_of(lw.w_gate, u0, u1, parts_);
      l.w_up = rows_of(lw.w_up, u0, u1, parts_);
      down_parts_.push_back(split_columns(lw.w_down, s.rank * per, per, parts_));
    }
    expert_down_parts_.push_back(std::move(experts));
    layers_.push_back(std::move(l));
    // What was read from the checkpoint's mapping to make the copies leaves
    // this process's memory: a rank keeps its shard, not the whole file.
    if (weights.checkpoint) {
      auto release = [&](const Matrix& m) {
        if (!m.panels && m.data)
          weights.checkpoint->release(m.data, static_cast<std::size_t>(m.rows * m.cols) * dtype_size(m.dtype));
      };
      for (const Matrix* m : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down, &lw.router}) release(*m);
      for (const auto& e : lw.experts)
        for (const Matrix* m : {&e.gate, &e.up, &e.down}) release(*m);
    }
  }
}

// Element e of the pool, as bytes (float32, bf16 or FP8 elements).
const void* CpuModel::kv_at(int64_t e) const {
  return reinterpret_cast<const uint8_t*>(pool_.data()) + e * pool_.layout().elem_bytes;
}

void CpuModel::kv_rows(const SeqChunk& ch, int64_t layer, int64_t g, int64_t from, int64_t to, const void** keys,
                       const void** values) const {
  const auto& L = pool_.layout();
  const int64_t row = L.row_elems() * L.elem_bytes;  // bytes: a block's rows of one KV head are consecutive
  for (int64_t j = from; j <= to;) {
    const int64_t slot = j % L.block_size, n = std::min(L.block_size - slot, to + 1 - j);
    const int64_t blk = ch.block_table[static_cast<std::size_t>(j / L.block_size)];
    const auto* k = static_cast<const uint8_t*>(kv_at(L.offset(blk, layer, 0, g, slot)));
    const auto* v = static_cast<const uint8_t*>(kv_at(L.offset(blk, layer, 1, g, slot)));
    for (int64_t i = 0; i < n; ++i) {
      keys[j - from + i] = k + i * row;
      values[j - from + i] = v + i * row;
    }
    j += n;
  }
}

void CpuModel::store_kv(const float* src, int64_t n, int64_t e) {
  if (kv_dtype_ == DType::kF32) {
    std::copy_n(src, n, pool_.data() + e);
    return;
  }
  if (kv_dtype_ == DType::kF8E4M3) {
    quantize_fp8_row(src, n, reinterpret_cast<uint8_t*>(pool_.data()) + e);
    return;
  }
  uint16_t* dst = reinterpret_cast<uint16_t*>(pool_.data()) + e;
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16_flushed(src[i]);
}

namespace {

// Thread t's share of n output columns among `parts`: contiguous ranges,
// multiples of 24 (every tile width and the panel divide it).
std::pair<int64_t, int64_t> column_range(int64_t n, int64_t parts, int64_t t) {
  const int64_t per = ((n + parts - 1) / parts + 23) / 24 * 24;
  const int64_t n0 = std::min(n, t * per);
  return {n0, std::min(n, n0 + per)};
}

}  // namespace

void CpuModel::matmul(const float* x, int64_t rows, std::initializer_list<Product> products) {
  const int64_t parts = threads_.size();
  threads_.run(parts, [&](int64_t t) {
    for (const Product& p : products) {
      const int64_t n = p.w->rows;
      const auto [n0, n1] = column_range(n, parts, t);
      if (n0 < n1) kern_.matmul(x, p.w->cols, rows, *p.w, n0, n1, p.y, n);
    }
  });
  for (const Product& p : products) {
    if (!p.bias) continue;
    const int64_t n = p.w->rows;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) p.y[r * n + j] += (*p.bias)[static_cast<std::size_t>(j)];
  }
}

// Each thread takes a range of output columns and, a block of rows at a
// time, computes the chunks' partial products added in the tree (one fused
// kernel where the table has one: kernels.h's matmul_tree).
void CpuModel::row_parallel(const float* x, int64_t rows, const std::vector<Matrix>& parts, float* y,
                            const std::vector<float>* bias, bool exchange) {
  const int64_t n = parts.front().rows;
  int64_t k = 0;
  for (const Matrix& p : parts) k += p.cols;
  const int64_t threads = threads_.size();
  threads_.run(threads, [&](int64_t t) {
    const auto [n0, n1] = column_range(n, threads, t);
    if (n0 >= n1) return;
    const int64_t block = kern_.tree_rows;  // rows a call, as the table asks (kernels.h)
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
      const int64_t rb = std::min(block, rows - r0);
      kern_.matmul_tree(x + r0 * k, k, rb, parts.data(), static_cast<int>(parts.size()), n0, n1, y + r0 * n, n);
    }
  });
  if (group_ && exchange) group_->reduce_tree(y, rows * n);  // the ranks' chunks, added in the same tree
  if (bias)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) y[r * n + j] += (*bias)[static_cast<std::size_t>(j)];
}

void CpuModel::rms_norm(const float* x, const std::vector<float>& w, int64_t n, float* y) const {
  const float ss = kern_.dot(x, x, n);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(c_.rms_norm_eps));
  for (int64_t i = 0; i < n; ++i) y[i] = w[static_cast<std::size_t>(i)] * (x[i] * r);
}

// Causal attention, in query blocks that share keys and values: up to six
// consecutive rows of one chunk for one head (prefill), or the heads of one
// KV head for one row (decode, GQA). Each query's scores, softmax and
// weighted sum are the same operations in the same order as for the query
// alone, so the blocking never changes a bit.
void CpuModel::attention(int64_t layer, std::span<const SeqChunk> chunks) {
  const int64_t hd = c_.head_dim, heads = c_.heads, group = c_.heads / c_.kv_heads;
  const int64_t q_dim = heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t rows = static_cast<int64_t>(rows_.size());
  auto sz = [](int64_t n) { return static_cast<std::size_t>(n); };

  query_blocks_.clear();
  if (kern_.attend) return attention_on_tiles(layer, chunks);
  for (int64_t r = 0; r < rows;) {
    int64_t end = r + 1;
    while (end < rows && rows_[sz(end)].chunk == rows_[sz(r)].chunk) ++end;
    if (end - r == 1) {
      for (int64_t g = 0; g < c_.kv_heads; ++g) query_blocks_.push_back({r, r + 1, g * group, (g + 1) * group});
    } else {
      // Taller blocks for long contexts: every key and value a block reads serves more queries
      // (at 4k tokens a block of 6 streams K and V from L3 at 3 flops a byte).
      const int64_t height = 6 * std::clamp<int64_t>((rows_[sz(end - 1)].pos + 1) / 512, 1, 8);
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t r0 = r; r0 < end; r0 += height) query_blocks_.push_back({r0, std::min(end, r0 + height), h, h + 1});
    }
    r = end;
  }

  threads_.run(static_cast<int64_t>(query_blocks_.size()), [&](int64_t task) {
    thread_local std::vector<float> scores;
    thread_local std::vector<const void*> keys, values;
    const QueryBlock& qb = query_blocks_[sz(task)];
    const int64_t g = qb.h0 / group;
    const SeqChunk& ch = chunks[sz(rows_[sz(qb.r0)].chunk)];
    // Query m is row r0 + m / nh, head h0 + m % nh; it sees positions [first_m, pos_m]
    // (Mistral's sliding window: only the last `window` of them).
    const int64_t nh = qb.h1 - qb.h0, M = (qb.r1 - qb.r0) * nh;
    auto pos_of = [&](int64_t m) { return rows_[sz(qb.r0 + m / nh)].pos; };
    auto first_of = [&](int64_t m) {
      return c_.sliding_window > 0 ? std::max<int64_t>(0, pos_of(m) - c_.sliding_window + 1) : int64_t{0};
    };
    int64_t lo = INT64_MAX, hi = -1, joint_lo = 0, joint_hi = INT64_MAX;  // joint: seen by every query
    for (int64_t m = 0; m < M; ++m) {
      lo = std::min(lo, first_of(m)), hi = std::max(hi, pos_of(m));
      joint_lo = std::max(joint_lo, first_of(m)), joint_hi = std::min(joint_hi, pos_of(m) + 1);
    }
    const int64_t count = hi + 1 - lo;
    keys.resize(sz(count));
    values.resize(sz(count));
    scores.resize(sz(M * count));
    kv_rows(ch, layer, g, lo, hi, keys.data(), values.data());
    const DType kv = kv_dtype_;  // FP8 rows too: the kernels take their values (code x scale)
    // Queries are hd apart within a row (heads of one KV head) or q_dim apart (one head, many rows).
    const int64_t ldq = nh > 1 ? hd : q_dim;
    const float* q = q_.data() + qb.r0 * q_dim + qb.h0 * hd;
    float* out = attn_.data() + qb.r0 * q_dim + qb.h0 * hd;
    kern_.dot_rows(q, ldq, M, kv, keys.data(), count, hd, scores.data(), count);
    for (int64_t m = 0; m < M; ++m) {
      float* s = scores.data() + m * count + (first_of(m) - lo);
      kern_.softmax(s, pos_of(m) + 1 - first_of(m), scale);
      // The positions before the joint range, alone (this also zeroes the output).
      const int64_t pre = std::max<int64_t>(0, std::min(joint_lo, pos_of(m) + 1) - first_of(m));
      kern_.weighted_sum(s, count, 1, kv, values.data() + (first_of(m) - lo), pre, hd, false, out + m * ldq, ldq);
    }
    if (joint_lo < joint_hi) {  // every query's middle part, together
      kern_.weighted_sum(scores.data() + (joint_lo - lo), count, M, kv, values.data() + (joint_lo - lo),
                         joint_hi - joint_lo, hd, true, out, ldq);
    }
    for (int64_t m = 0; m < M; ++m) {  // the rest, alone
      const int64_t from = std::max(joint_lo, std::max(joint_hi, first_of(m)));
      const int64_t n = pos_of(m) + 1 - from;
      if (n > 0)
        kern_.weighted_sum(scores.data() + m * count + (from - lo), count, 1, kv, values.data() + (from - lo), n, hd,
                           true, out + m * ldq, ldq);
    }
  });
}

// kBf16Amx's attention (KernelTable::attend): a task per chunk and KV head, its keys and values rearranged
// once for all the chunk's rows and the KV head's query heads; a chunk's rows split in pieces only where the
// tasks would not keep every thread busy. Each element is the same whatever the task (kernels.h).
void CpuModel::attention_on_tiles(int64_t layer, std::span<const SeqChunk> chunks) {
  const int64_t hd = c_.head_dim, group = c_.heads / c_.kv_heads, q_dim = c_.heads * hd;
  const int64_t rows = static_cast<int64_t>(rows_.size()), window = std::max<int64_t>(0, c_.sliding_window);
  auto sz = [](int64_t n) { return static_cast<std::size_t>(n); };
  std::vector<std::pair<int64_t, int64_t>> spans;  // each chunk's rows
  for (int64_t r = 0; r < rows;) {
    int64_t end = r + 1;
    while (end < rows && rows_[sz(end)].chunk == rows_[sz(r)].chunk) ++end;
    spans.emplace_back(r, end);
    r = end;
  }
  const int64_t tasks = static_cast<int64_t>(spans.size()) * c_.kv_heads;
  if (tasks == 0) return;
  const int64_t pieces = std::max<int64_t>(1, (2 * threads_.size() + tasks - 1) / tasks);
  for (const auto& [r0, r1] : spans) {
    const int64_t step = std::max<int64_t>(16, (r1 - r0 + pieces - 1) / pieces);
    for (int64_t a = r0; a < r1; a += step)
      for (int64_t g = 0; g < c_.kv_heads; ++g)
        query_blocks_.push_back({a, std::min(r1, a + step), g * group, (g + 1) * group});
  }
  threads_.run(static_cast<int64_t>(query_blocks_.size()), [&](int64_t task) {
    thread_local std::vector<const void*> keys, values;
    const QueryBlock& qb = query_blocks_[sz(task)];
    const SeqChunk& ch = chunks[sz(rows_[sz(qb.r0)].chunk)];
    const int64_t g = qb.h0 / group, pos0 = rows_[sz(qb.r0)].pos, last = pos0 + (qb.r1 - qb.r0) - 1;
    const int64_t first = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0, base = first / 32 * 32;
    keys.assign(sz(last + 1 - base), nullptr);  // positions before the first any row sees: not read
    values.assign(sz(last + 1 - base), nullptr);
    kv_rows(ch, layer, g, first, last, keys.data() + (first - base), values.data() + (first - base));
    const AttendTask t{q_.data() + qb.r0 * q_dim + qb.h0 * hd, attn_.data() + qb.r0 * q_dim + qb.h0 * hd, q_dim, hd,
                       qb.r1 - qb.r0, qb.h1 - qb.h0, hd, pos0, window, base, kv_dtype_, keys.data(), values.data(),
                       1.0f / std::sqrt(static_cast<float>(hd))};
    kern_.attend(t);
  });
}

void CpuModel::moe(int64_t layer, int64_t R) {
  const LayerWeights& lw = layers_[static_cast<std::size_t>(layer)];
  const MoeConfig& m = c_.moe;
  const int64_t H = c_.hidden, E = m.experts, K = m.top_k, U = m.intermediate;
  auto sz = [](int64_t n) { return static_cast<std::size_t>(n); };
  probs_.resize(sz(R * E));
  matmul(xn_.data(), R, {{&lw.router, probs_.data(), nullptr}});
  // Routing, row by row: softmax in float32, the k most probable (ties to the lower id), renormalised.
  route_expert_.resize(sz(R * K));
  route_weight_.resize(sz(R * K));
  route_rows(probs_.data(), R, E, K, m.norm_topk, route_expert_.data(), route_weight_.data());
  expert_slots_.assign(sz(E), {});
  for (int64_t s = 0; s < R * K; ++s) expert_slots_[sz(route_expert_[sz(s)])].push_back(s);
  int64_t* counted = expert_tokens_.data() + moe_index_[sz(layer)] * E;
  for (int64_t e = 0; e < E; ++e) counted[e] += static_cast<int64_t>(expert_slots_[sz(e)].size());
  // Each expert once, over the rows that chose it: this rank's experts, or its share of every expert. With
  // experts whole on their ranks, a slot for another rank's home row goes straight to the send buffer.
  slot_out_.resize(sz(R * K * H));
  if (expert_parallel_) {
    combine_ = plan_combine(route_expert_, K, split_);
    lay_out_combine(combine_, slot_out_.data(), H, combine_bufs_);
  }
  for (int64_t e = 0; e < E; ++e) {
    const auto& slots = expert_slots_[sz(e)];
    const auto n = static_cast<int64_t>(slots.size());
    if (n == 0 || (expert_parallel_ && !split_.owns(e))) continue;
    xe_.resize(sz(n * H));
    ge_.resize(sz(n * U));
    ue_.resize(sz(n * U));
    ye_.resize(sz(n * H));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(xn_.data() + slots[sz(i)] / K * H, H, xe_.data() + i * H);
    const ExpertWeights& ex = lw.experts[sz(e)];
    matmul(xe_.data(), n, {{&ex.gate, ge_.data(), nullptr}, {&ex.up, ue_.data(), nullptr}});
    rows_in_pieces(n, [&](int64_t a, int64_t b) {
      swiglu(ge_.data() + a * U, ue_.data() + a * U, (b - a) * U);
    });
    row_parallel(ge_.data(), n, expert_down_parts_[sz(layer)][sz(e)], ye_.data(), nullptr, /*exchange=*/false);
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(ye_.data() + i * H, H,
                  expert_parallel_ ? combine_bufs_.write[sz(slots[sz(i)])] : slot_out_.data() + slots[sz(i)] * H);
  }
  // Each row's experts summed in its slot order (on the row's home rank, with
  // experts placed whole: expert_parallel.h), then the residual.
  int64_t r0 = 0, r1 = R;
  if (expert_parallel_) {
    exchange_slots(*group_, combine_, H, combine_bufs_);
    r0 = home_begin(R, split_.width, split_.rank), r1 = home_begin(R, split_.width, split_.rank + 1);
  } else if (group_) {
    group_->reduce_tree(slot_out_.data(), R * K * H);  // every slot: the ranks' shares of its expert, in the tree
  }
  // Where each slot's output is read: the combine's layout, or slot_out itself.
  auto slot = [&](int64_t s) { return expert_parallel_ ? combine_bufs_.read[sz(s)] : slot_out_.data() + s * H; };
  moe_out_.resize(sz(R * H));
  rows_in_pieces(r1 - r0, [&](int64_t a, int64_t b) {
    for (int64_t r = r0 + a; r < r0 + b; ++r)
      for (int64_t i = 0; i < H; ++i) {
        float acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += route_weight_[sz(r * K + k)] * slot(r * K + k)[i];
        moe_out_[sz((r - r0) * H + i)] = acc;
      }
  });
  const float* combined = moe_out_.data();
  if (expert_parallel_) {
    std::vector<int64_t> counts(combine_.home_rows);
    for (auto& c : counts) c *= H;
    group_->all_gather(moe_out_.data(), counts, xn_.data());  // xn_: the experts' inputs, read by now
    combined = xn_.data();
  }
  rows_in_pieces(R, [&](int64_t a, int64_t b) {
    for (int64_t i = a * H; i < b * H; ++i) x_[sz(i)] += combined[i];
  });
}

// Rows [0, R) as up to four pieces a thread (one piece for a single row): f(r0, r1) for each.
void CpuModel::rows_in_pieces(int64_t R, const std::function<void(int64_t, int64_t)>& f) {
  const int64_t pieces = std::min<int64_t>(R, 4 * threads_.size());
  if (pieces <= 1) return f(0, R);
  threads_.run(pieces, [&](int64_t i) { f(R * i / pieces, R * (i + 1) / pieces); });
}

void CpuModel::forward(std::span<const SeqChunk> chunks, std::vector<float>& logits) {
  const auto& L = pool_.layout();
  const int64_t H = c_.hidden, hd = c_.head_dim, half = hd / 2;
  const int64_t q_dim = c_.heads * hd, kv_dim = c_.kv_heads * hd;

  rows_.clear();
  std::vector<int64_t> logit_rows, hidden_rows;
  for (std::size_t ci = 0; ci < chunks.size(); ++ci) {
    const SeqChunk& ch = chunks[ci];
    const int64_t end = ch.start_pos + static_cast<int64_t>(ch.tokens.size());
    if (static_cast<int64_t>(ch.block_table.size()) * L.block_size < end) {
      throw Error("internal: a sequence's block table covers " +
                  std::to_string(ch.block_table.size() * static_cast<std::size_t>(L.block_size)) +
                  " positions but the step needs " + std::to_string(end));
    }
    for (std::size_t t = 0; t < ch.tokens.size(); ++t) {
      if (ch.logits_all || (ch.logits_last && t + 1 == ch.tokens.size()))
        logit_rows.push_back(static_cast<int64_t>(rows_.size()));
      if (ch.hidden_all || (ch.hidden_last && t + 1 == ch.tokens.size()))
        hidden_rows.push_back(static_cast<int64_t>(rows_.size()));
      rows_.push_back({static_cast<int64_t>(ci), ch.start_pos + static_cast<int64_t>(t)});
    }
  }
  const int64_t R = static_cast<int64_t>(rows_.size());
  auto sz = [](int64_t n) { return static_cast<std::size_t>(n); };
  x_.resize(sz(R * H));
  xn_.resize(sz(R * std::max(H, q_dim)));
  q_.resize(sz(R * q_dim));
  kbuf_.resize(sz(R * kv_dim));
  vbuf_.resize(sz(R * kv_dim));
  attn_.resize(sz(R * q_dim));
  gate_.resize(sz(R * c_.intermediate));
  up_.resize(sz(R * c_.intermediate));
  cos_.resize(sz(R * half));
  sin_.resize(sz(R * half));

  // Embeddings and the rotary table of each row's position (float32, as Hugging Face).
  for (int64_t r = 0; r < R; ++r) {
    const auto& ref = rows_[sz(r)];
    const int32_t tok = chunks[sz(ref.chunk)].tokens[sz(ref.pos - chunks[sz(ref.chunk)].start_pos)];
    if (tok < 0 || tok >= c_.vocab) throw Error("token id " + std::to_string(tok) + " is outside the vocabulary (0.." + std::to_string(c_.vocab - 1) + ")");
    for (int64_t i = 0; i < H; ++i)
      x_[sz(r * H + i)] = load_as_f32(w_.embed.data, w_.embed.dtype, sz(tok * H + i));
    const float p = static_cast<float>(ref.pos);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = p * inv_freq_[sz(i)];
      cos_[sz(r * half + i)] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_[sz(r * half + i)] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }

  auto rope = [&](float* v, int64_t r) {
    const float* cs = cos_.data() + r * half;
    const float* sn = sin_.data() + r * half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cs[i] - b * sn[i];
      v[i + half] = b * cs[i] + a * sn[i];
    }
  };

  // The per-row steps between the products go over the threads in pieces of rows (rows_in_pieces): a row's
  // arithmetic is the same whichever thread does it.
  for (int64_t l = 0; l < c_.layers; ++l) {
    const LayerWeights& lw = layers_[sz(l)];
    rows_in_pieces(R, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) rms_norm(x_.data() + r * H, lw.attn_norm, H, xn_.data() + r * H);
    });
    const bool b = c_.qkv_bias;
    matmul(xn_.data(), R,
           {{&lw.wq, q_.data(), b ? &lw.bq : nullptr},
            {&lw.wk, kbuf_.data(), b ? &lw.bk : nullptr},
            {&lw.wv, vbuf_.data(), b ? &lw.bv : nullptr}});
    rows_in_pieces(R, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t h = 0; h < c_.heads; ++h) {
          float* q = q_.data() + r * q_dim + h * hd;
          if (c_.qk_norm) rms_norm(q, lw.q_norm, hd, q);
          rope(q, r);
        }
        for (int64_t h = 0; h < c_.kv_heads; ++h) {
          float* k = kbuf_.data() + r * kv_dim + h * hd;
          if (c_.qk_norm) rms_norm(k, lw.k_norm, hd, k);
          rope(k, r);
        }
        const auto& ref = rows_[sz(r)];
        const int64_t blk = chunks[sz(ref.chunk)].block_table[sz(ref.pos / L.block_size)];
        for (int64_t g = 0; g < c_.kv_heads; ++g) {  // each KV head's run of the block: head_dim at the token's slot
          store_kv(kbuf_.data() + r * kv_dim + g * hd, hd, L.offset(blk, l, 0, g, ref.pos % L.block_size));
          store_kv(vbuf_.data() + r * kv_dim + g * hd, hd, L.offset(blk, l, 1, g, ref.pos % L.block_size));
        }
      }
    });
    attention(l, chunks);
    row_parallel(attn_.data(), R, wo_parts_[sz(l)], xn_.data(), lw.bo.empty() ? nullptr : &lw.bo);
    rows_in_pieces(R, [&](int64_t r0, int64_t r1) {  // the residual, then the MLP's norm
      for (int64_t i = r0 * H; i < r1 * H; ++i) x_[sz(i)] += xn_[sz(i)];
      for (int64_t r = r0; r < r1; ++r) rms_norm(x_.data() + r * H, lw.mlp_norm, H, xn_.data() + r * H);
    });
    if (c_.moe.at(l)) {
      moe(l, R);
      continue;
    }
    matmul(xn_.data(), R, {{&lw.w_gate, gate_.data(), nullptr}, {&lw.w_up, up_.data(), nullptr}});
    const int64_t I = c_.intermediate;
    rows_in_pieces(R, [&](int64_t r0, int64_t r1) {
      swiglu(gate_.data() + r0 * I, up_.data() + r0 * I, (r1 - r0) * I);
    });
    row_parallel(gate_.data(), R, down_parts_[sz(l)], xn_.data(), nullptr);
    rows_in_pieces(R, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * H; i < r1 * H; ++i) x_[sz(i)] += xn_[sz(i)];
    });
  }

  // The final-normed hidden states asked for (embeddings), then the final
  // norm and LM head for the rows that want logits only.
  hidden_out_.resize(hidden_rows.size() * sz(H));
  for (std::size_t i = 0; i < hidden_rows.size(); ++i)
    rms_norm(x_.data() + hidden_rows[i] * H, w_.final_norm, H, hidden_out_.data() + i * sz(H));
  const int64_t LR = static_cast<int64_t>(logit_rows.size());
  for (int64_t i = 0; i < LR; ++i) rms_norm(x_.data() + logit_rows[sz(i)] * H, w_.final_norm, H, xn_.data() + i * H);
  logits.resize(sz(LR * c_.vocab));
  if (LR > 0) matmul(xn_.data(), LR, {{&lm_head_, logits.data(), nullptr}});
}

}  // namespace tandem::runtime::cpu
