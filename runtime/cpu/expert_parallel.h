// Expert parallelism inside a tensor-parallel group (tp_group.h): attention
// stays tensor-parallel, and a mixture of experts' layer gives each of the
// group's w ranks E / w whole experts (rank r: experts [r E/w, (r+1) E/w)).
//
// After attention's exchange every rank holds every row's hidden vector, and
// every rank routes every row (the same bits: the same inputs, the router
// replicated), so the dispatch moves nothing: a rank runs its experts over
// the rows that chose them. The combine is where data moves. Rows are split
// among the ranks in contiguous blocks (a row's home rank); each expert's
// output for a (row, slot) goes to the row's home rank (one all_to_all),
// which adds the row's k outputs in its slot order, exactly as one rank
// would; then every rank gathers every home's combined rows (one
// all_gather). So a row's result is the same bits at every width, and each
// rank receives about R k H (w-1)/w^2 + R H (w-1)/w floats a layer instead
// of the R k H (w-1)/w of gathering every slot's output.
//
// Without expert parallelism (cluster.expert_parallel = false) every expert
// is split across the ranks as the dense MLP is (its units; down_proj in the
// fixed tree's chunks), and one reduce_tree over every slot's output adds the
// ranks' parts.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/cpu/tp_group.h"

namespace tandem::runtime::cpu {

// A MoE layer's routing, row by row, as Hugging Face does it: the router's
// logits ([rows][experts], overwritten by the probabilities) through a
// softmax in float32, the top_k most probable experts (ties to the lower
// id) in slot order, their probabilities renormalised over the k when
// `renormalise`. expert, weight: [rows][top_k]. The softmax: max = the
// largest logit; e_j = exp_fixed(l_j - max) (kernels.h: Tandem's own exp,
// the same bits on every CPU, where libm's expf is picked by CPU); sum in
// increasing j; p_j = e_j / sum. Every operation rounds once to float32.
void route_rows(float* logits, int64_t rows, int64_t experts, int64_t top_k, bool renormalise, int32_t* expert,
                float* weight);

struct ExpertSplit {
  int rank = 0, width = 1;
  int64_t experts = 0;
  int owner(int64_t expert) const { return static_cast<int>(expert / (experts / width)); }
  bool owns(int64_t expert) const { return owner(expert) == rank; }
  int64_t first() const { return rank * (experts / width); }  // this rank's experts: [first(), first() + experts / width)
  int64_t count() const { return experts / width; }
};

// The first row of `rank`'s home block among `rows` (rank = width: rows).
constexpr int64_t home_begin(int64_t rows, int width, int rank) { return rows * rank / width; }

// The rows each of `width` ranks' experts computed, from rows per expert
// ([MoE layer][expert], flattened, `experts` a layer; ModelBackend::expert_tokens).
std::vector<int64_t> rows_by_rank(std::span<const int64_t> expert_tokens, int64_t experts, int width);

// One step's combine, as this rank sees it. Slots are row * top_k + k.
struct CombinePlan {
  std::vector<std::vector<int64_t>> send;  // [rank q]: the slots this rank computed for q's home rows, in slot order
  std::vector<std::vector<int64_t>> recv;  // [rank q]: the slots of this rank's home rows that q computed, in slot order
  std::vector<int64_t> kept;               // the slots of this rank's home rows that it computed, in slot order
  std::vector<int64_t> home_rows;          // [rank q]: q's home row count
  int64_t slots = 0;                       // rows * top_k
};

// route_expert: [rows][top_k], each row's experts in slot order.
CombinePlan plan_combine(std::span<const int32_t> route_expert, int64_t top_k, const ExpertSplit& split);

// Where each slot's expert output is written and read, so that the exchange
// is the all-to-all and nothing else: a slot this rank computes for another
// home is written straight into its place in the send buffer, one another
// rank computed for this home is read straight from the receive buffer, and
// one it computes for itself stays in slot_out.
struct CombineBuffers {
  std::vector<float> send, recv;   // [slots sent][hidden], [slots received][hidden], by rank then slot order
  std::vector<float*> write;       // [slot]: where this rank writes its expert's output (null: another's expert)
  std::vector<const float*> read;  // [slot]: where the home reads it (null: not a slot of this rank's home rows)
};
// Sizes b's buffers for the plan and points write/read into them and into
// slot_out ([slots][hidden]); the pointers hold until the next lay_out.
void lay_out_combine(const CombinePlan& plan, float* slot_out, int64_t hidden, CombineBuffers& b);

// The exchange (every rank, collectively): afterwards b.read[s] holds slot
// s's expert output for every slot s of this rank's home rows.
void exchange_slots(TpGroup& group, const CombinePlan& plan, int64_t hidden, CombineBuffers& b);

}  // namespace tandem::runtime::cpu
