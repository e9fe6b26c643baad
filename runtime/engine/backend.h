// A model's forward pass over one engine step on some device: all the engine
// sees of the hardware. cpu/ is the reference; cuda/ (TANDEM_CUDA) is held
// to it by the `gpu` tests. backend_registry.h makes one by name.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace tandem::runtime {

// A CUDA rank with 8-bit weights turns a long product's weights into bf16
// this many bytes at a time (CudaModel::dequantized_gemm); the pool sizing
// leaves room for it.
inline constexpr int64_t kDequantTileBytes = int64_t{64} << 20;

// One sequence's part of a step.
struct SeqChunk {
  int64_t start_pos = 0;                   // position of tokens[0] in its sequence
  std::span<const int32_t> tokens;         // this step's tokens of the sequence
  std::span<const int32_t> block_table;    // pool blocks covering positions [0, start_pos + tokens.size())
  bool logits_last = false;                // logits for the last token (to sample the next one)
  bool logits_all = false;                 // logits for every token (prompt logprobs)
  // Embeddings: the final-normed hidden state of the last token, or of every
  // token, read back by hidden_rows() after the step.
  bool hidden_last = false;
  bool hidden_all = false;
};

// One logits row's draw made on the device (forward_draw): what sample_token
// does for a row with no penalties, logprobs, top-k or top-p. temperature 0
// is greedy; u is the request's uniform number for the step (counter_uniform).
struct DeviceDraw {
  float temperature = 0.0f, min_p = 0.0f;
  double u = 0.0;
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  virtual std::string_view name() const = 0;
  // Runs one step: reads and writes the step's KV in the pool, and returns
  // logits [rows wanting logits][vocab] in host memory, in chunk order and
  // within a chunk in position order. Blocks until they are there. Throws
  // tandem::Error on a block table too short for the positions it must hold.
  virtual void forward(std::span<const SeqChunk> chunks, std::vector<float>& logits) = 0;
  // A tensor-parallel follower's step (runtime/service/group_worker.h): the
  // leader's chunks, logits flags as the leader has them, and no logits
  // computed here (only the leader samples). By default forward() with the
  // flags cleared; the CUDA model keeps them to lay its step out as the
  // leader's (every rank of an NCCL group must capture the same steps as graphs).
  virtual void forward_follower(std::span<SeqChunk> chunks, std::vector<float>& scratch) {
    for (SeqChunk& c : chunks) c.logits_last = c.logits_all = false;
    forward(chunks, scratch);
  }
  // A mixture of experts: the rows routed to each expert so far, MoE layer
  // by MoE layer ([layer][expert], flattened; a row counts once for each of
  // its top-k experts). Empty for a dense model, or a backend that does not count.
  virtual std::vector<int64_t> expert_tokens() const { return {}; }
  // The ranks a mixture of experts' experts are placed on, whole (expert
  // parallelism: rank r of a group of w holds experts [r E/w, (r+1) E/w)); 1 otherwise.
  virtual int expert_ranks() const { return 1; }
  // Optional, for steps whose every sampled row is plain greedy: the same
  // step, returning each logits row's argmax (ties to the lowest id, as
  // sample_token) instead of the row, so the logits need not travel to the
  // host. False (and nothing run) where the backend has no such path.
  virtual bool forward_argmax(std::span<const SeqChunk> chunks, std::vector<int32_t>& tokens) {
    (void)chunks;
    (void)tokens;
    return false;
  }
  // Optional, for steps whose every sampled row is greedy or plain
  // temperature (and min-p): the same step, drawing logits row i's token by
  // draws[i] where the logits are. False (and nothing run) where the backend
  // has no such path.
  virtual bool forward_draw(std::span<const SeqChunk> chunks, std::span<const DeviceDraw> draws,
                            std::vector<int32_t>& tokens) {
    (void)chunks;
    (void)draws;
    (void)tokens;
    return false;
  }
  // After forward(): the final-normed hidden state ([rows][hidden], float32)
  // of the rows the chunks' hidden_last / hidden_all ask for, in chunk and
  // position order. False where the backend cannot give them (embeddings are
  // then refused).
  virtual bool hidden_rows(std::vector<float>& rows) {
    (void)rows;
    return false;
  }
  virtual bool has_hidden_rows() const { return false; }
  // False for a checkpoint without an LM head (an embedding model): generation is refused.
  virtual bool has_lm_head() const { return true; }
  // Whether forward_argmax and forward_draw run (asked first by a wrapper
  // that tells other ranks what runs: runtime/service/group_worker.h).
  virtual bool has_argmax() const { return false; }
  virtual bool has_draw() const { return false; }
};

}  // namespace tandem::runtime
