// The CUDA model's mixture-of-experts layers (cuda_model.h): the router
// whole on every rank, this rank's experts (or its share of each expert's
// units), and a layer's MLP as the launches of ops.h's MoE section.
//
// Every rank of a group routes every row: its input is the group's sum,
// the same bits on every rank, and the router's product is products()'
// (a fixed order of addition, not cuBLAS's), so every rank picks the same
// experts. With experts whole on their ranks (expert parallelism) each rank
// computes its experts' slots; rows are split among the ranks in blocks of
// c = ceil(R / w) (a row's home), so home q's slots are one contiguous
// block of slot_out, and one all-to-all of equal blocks (c k H floats to
// each rank, no packing) brings every slot of this rank's home rows from the
// rank that owns its expert; the home adds each row's k outputs in slot
// order, and one all-gather of the homes' c rows each lays every row out in
// order on every rank. A rank receives w c k H + w c H floats a layer (the
// CPU's all-to-all sends only the slots an expert produced; on the device
// the counts are not on the host, so the blocks are whole). Without expert
// parallelism each rank computes its units of every expert and the group
// sums the slots' partial outputs as it sums the dense MLP's.
#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/cpu/tp_group.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {

void CudaModel::upload_moe(const ModelConfig& full, const LayerWeights& lw, DevLayer& d) {
  const cpu::TpShard s = group_ ? group_->shard() : cpu::TpShard{};
  const int64_t E = full.moe.experts;
  if (static_cast<int64_t>(lw.experts.size()) != E)
    throw Error("internal: a MoE layer holds " + std::to_string(lw.experts.size()) + " experts, the config " +
                std::to_string(E));
  first_expert_ = expert_parallel_ ? s.rank * (E / s.width) : 0;
  local_experts_ = expert_parallel_ ? E / s.width : E;
  // Each expert's units this rank computes: all of them (experts whole, or no group), else its share.
  const int64_t u0 = expert_parallel_ ? 0 : cpu::shard_offsets(full, s).expert_unit, u1 = u0 + c_.moe.intermediate;
  std::vector<Part> gate_up, down;
  for (int64_t e = first_expert_; e < first_expert_ + local_experts_; ++e) {
    const ExpertWeights& ex = lw.experts[static_cast<std::size_t>(e)];
    gate_up.push_back({&ex.gate, u0, u1});
    gate_up.push_back({&ex.up, u0, u1});
    down.push_back({&ex.down, 0, -1, u0, u1});
  }
  d.router = upload({{&lw.router}}, "the router");
  d.experts_gate_up = upload(gate_up, "the experts' gate and up");
  d.experts_down = upload(down, "the experts' down_proj");
  d.moe_index = 0;
  for (const DevLayer& l : layers_) d.moe_index += l.moe_index >= 0;
}

void CudaModel::size_moe(int64_t R) {
  const int64_t H = c_.hidden, E = c_.moe.experts, K = c_.moe.top_k;
  int64_t slot_rows = R;
  if (group_ && !expert_parallel_) grow(gathered_, group_->shard().width * R * K * H);  // every slot's sums
  if (expert_parallel_) {  // whole home blocks: slot_out and the gathered parts w c k H, the combined rows w c H
    const int64_t w = group_->shard().width, c = (R + w - 1) / w;
    grow(gathered_, w * c * K * H);
    grow(moe_home_, c * H);
    grow(y_, w * c * H);
    slot_rows = w * c;  // slot_out_: every home's block whole
  }
  grow(moe_in_, R * H);
  grow(router_logits_, R * E);
  grow(route_weight_, R * K);
  grow(route_expert_, R * K);
  grow(moe_order_, R * K);
  grow(moe_offsets_, local_experts_ + 1);
  grow(moe_tiles_, local_experts_ + 1);
  grow(moe_gate_up_, R * K * 2 * moe_intermediate_room_);
  grow(slot_out_, slot_rows * K * H);
}

void CudaModel::enqueue_moe(const DevLayer& lw, int64_t R) {
  const int64_t H = c_.hidden, E = c_.moe.experts, K = c_.moe.top_k, U = c_.moe.intermediate, slots = R * K;
  // The router: one product of every row (the same bits on every rank), then each row's top k.
  product(lw.router, moe_in_.get(), R, router_logits_.get());
  moe_route(router_logits_.get(), R, E, K, c_.moe.norm_topk, route_expert_.get(), route_weight_.get(), stream_);
  const RowGroups groups{moe_order_.get(), moe_offsets_.get(), moe_tiles_.get()};
  moe_group(route_expert_.get(), slots, E, first_expert_, local_experts_, groups,
            expert_counts_.get() + lw.moe_index * E, stream_);
  // This rank's experts over the rows that chose them: gate|up by position, then down into each slot.
  const int64_t tiles = product_tiles(slots, local_experts_);
  Product gate_up;
  gate_up.in = moe_in_.get(), gate_up.gather = true, gate_up.top_k = K;
  gate_up.w = lw.experts_gate_up.data.get(), gate_up.w_dtype = lw.experts_gate_up.dtype;
  gate_up.scales = lw.experts_gate_up.scales(), gate_up.n = 2 * U, gate_up.k = H;
  gate_up.out = moe_gate_up_.get();
  products(gate_up, groups, local_experts_, tiles, stream_);
  Product down;
  down.in = moe_gate_up_.get(), down.swiglu = true;
  down.w = lw.experts_down.data.get(), down.w_dtype = lw.experts_down.dtype, down.scales = lw.experts_down.scales();
  down.n = H, down.k = U;
  down.out = slot_out_.get(), down.scatter = true;
  products(down, groups, local_experts_, tiles, stream_);
  // Each row's experts combined in slot order, from the ranks that own them (expert parallelism), from the
  // group's sum of every slot (experts split by units), or from this rank's slots.
  if (expert_parallel_) {
    const int64_t w = group_->shard().width, c = (R + w - 1) / w;
    const int64_t h0 = std::min(R, group_->shard().rank * c), h1 = std::min(R, h0 + c);
    group_->all_to_all(slot_out_.get(), gathered_.get(), c * K * H, stream_);  // [rank p][my home's slots][H]
    moe_combine(gathered_.get(), c * K * H, local_experts_, route_expert_.get() + h0 * K, route_weight_.get() + h0 * K,
                h1 - h0, K, H, moe_home_.get(), stream_);
    group_->all_gather(moe_home_.get(), y_.get(), c * H, stream_);  // home q's rows at q c: rows 0..R-1 in order
    return;
  }
  group_sum(slot_out_.get(), slots * H);
  moe_combine(slot_out_.get(), 0, E, route_expert_.get(), route_weight_.get(), R, K, H, y_.get(), stream_);
}

// Between steps (a worker's report): the stream holds no group exchange then, so waiting for it cannot hang.
std::vector<int64_t> CudaModel::expert_tokens() const {
  std::vector<int64_t> out;
  if (expert_counts_.size() == 0) return out;
  std::vector<unsigned long long> counts(expert_counts_.size());
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  TANDEM_CUDA_CHECK(cudaMemcpy(counts.data(), expert_counts_.get(), counts.size() * sizeof(unsigned long long),
                               cudaMemcpyDeviceToHost));
  out.assign(counts.begin(), counts.end());
  return out;
}

}  // namespace tandem::runtime::cuda
