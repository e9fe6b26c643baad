// A worker's engine as the run loops see it: requests in, finished results
// out, counters for the job summary. Used in-process (-np 1) and by the MPI
// worker loop alike.
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/tiers.h"
#include "runtime/engine/engine.h"
#include "runtime/service/protocol.h"

namespace tandem::service {

class WorkerCore {
 public:
  // tiers: host memory and the disk store under the pool (null: none); the
  // pool must already have them as its lower tier.
  // The backend (runtime/engine/backend_registry.h) computes on `pool`.
  WorkerCore(int rank, Role role, const runtime::ModelConfig& config,
             std::unique_ptr<runtime::ModelBackend> backend, kv::BlockPool& pool, const runtime::Tokenizer* tokenizer,
             runtime::EngineOptions options, kv::KvTiers* tiers = nullptr);

  // A request the engine refuses comes back at once as a failed result.
  // prefill_only: the disaggregated prefill side (see Handoff). A request
  // whose prefix is being read from the disk store waits aside until it is
  // in host memory; the engine meanwhile runs the others.
  void submit(const WireRequest& request, bool prefill_only = false);
  // Decode side of a disaggregated request, before reserving its blocks: true
  // when it could run here; otherwise it is refused (its error line goes to
  // rank 0 with the next step's results) and false.
  bool fits(const WireRequest& request);
  bool has_work() const {
    return engine_.has_work() || !refused_.empty() || !first_tokens_.empty() || !staged_.empty();
  }
  int64_t load() const { return engine_.num_running() + engine_.num_waiting(); }

  // A prefilled request ready to travel: its KV blocks (still allocated here;
  // release() them once sent) and what goes with them.
  struct Handoff {
    uint64_t id = 0;
    std::vector<int32_t> kv_blocks;
    WireKvReady ready;
  };
  struct StepOutput {
    std::vector<WireResult> results;
    std::vector<Handoff> handoffs;
    WireDeltas deltas;  // new tokens of unfinished streaming requests
    bool progress = false;  // false: nothing ran (only requests waiting on the disk store): back off
  };
  // One engine step: the requests that finished in it, and prefills to send.
  StepOutput step();

  // Decode side of disaggregation.
  std::optional<std::vector<int32_t>> reserve(int64_t n_tokens) { return engine_.reserve_blocks(n_tokens); }
  int64_t block_size() const { return pool_.layout().block_size; }
  // The cached blocks holding the longest prefix of prompt's full blocks (referenced; release() them).
  std::vector<int32_t> cached_prefix(std::span<const int32_t> prompt);
  // Starts reading the prompt's stored prefix blocks; false while some are still on the way.
  bool prefix_ready(std::span<const int32_t> prompt);
  void release(const std::vector<int32_t>& blocks) { engine_.release_blocks(blocks); }
  // kv_blocks_moved: how many of blocks came over the transport (the rest were cached here).
  void add_prefilled(const WireRequest& request, std::vector<int32_t> blocks, const WireKvReady& ready,
                     std::chrono::steady_clock::time_point arrival, int64_t kv_blocks_moved);

  // Drops a request wherever it is in the engine; it comes back as a result
  // with finish_reason "abort".
  void cancel(uint64_t id);
  // A request that never reached the engine (cancelled while its KV was on
  // the way): reported as aborted at the next step.
  void abort_outside(uint64_t id);

  // The prefix cache's changes since the last call; false when there are none.
  // share_store_index: the first call also lists every block of the disk store.
  bool drain_cache_events(WireCacheEvents& events);
  void share_store_index() { store_index_pending_ = true; }
  // Writes what the disk store still has queued and closes it (end of the job).
  void close_tiers();

  void count_kv_sent(int dest, int64_t bytes) {
    kv_bytes_ += bytes;
    kv_to_[dest].first += bytes;
  }
  // Wall time that ended with KV of ours in flight: to anyone, and to `dest`.
  void count_kv_time(double any_seconds, int dest, double dest_seconds) {
    kv_seconds_ += any_seconds;
    if (dest_seconds > 0) kv_to_[dest].second += dest_seconds;
  }
  void set_kv_wait_seconds(double s) { kv_wait_s_ = s; }
  std::size_t block_bytes() const { return pool_.layout().block_bytes(); }
  RankReport report() const;
  // Engine steps since the last call (at most the last 512), for the planner.
  std::vector<runtime::StepSample> take_step_samples();
  void set_role(Role role) { role_ = role; }
  // The ranks of this worker (a tensor-parallel group's leader reports for the group).
  void set_group_width(int width) { group_width_ = width; }
  // The tiers' counters from now on: the tiers outlived an earlier worker of this rank (a regroup), which reported its own.
  void count_tiers_from_now();

 private:
  struct Staged {
    WireRequest request;
    bool prefill_only;
    std::vector<uint64_t> hashes;
  };
  // An embedding line in the engine: one engine request per input (ids
  // sub_id(line, j)), gathered into one result.
  struct Embedding {
    std::vector<std::vector<float>> vectors;
    int64_t left = 0, prompt_tokens = 0, computed = 0;
    double ttft_s = 0, e2e_s = 0;
    bool aborted = false;
  };
  static uint64_t sub_id(uint64_t line, std::size_t j) { return (uint64_t{j + 1} << 40) | line; }
  static uint64_t line_of(uint64_t id) { return id & ((uint64_t{1} << 40) - 1); }
  void poll_tiers();
  void admit(const WireRequest& request, bool prefill_only);
  void admit_embedding(const WireRequest& request);
  // An engine output of an embedding's input: kept; true when it was one (the line's result is out once all are).
  bool gather_embedding(runtime::EngineOutput& o, std::vector<WireResult>& results);
  void refuse(uint64_t id, const std::string& why);

  int rank_;
  Role role_;
  std::optional<kv::TierStats> tiers_base_;  // count_tiers_from_now()
  kv::BlockPool& pool_;
  kv::KvTiers* tiers_;
  int64_t config_experts_ = 0;  // a mixture of experts' experts per layer (0: dense)
  runtime::Engine engine_;
  std::deque<Staged> staged_;
  bool store_index_pending_ = false;
  std::vector<WireResult> refused_;
  std::unordered_set<uint64_t> streaming_;
  std::unordered_map<uint64_t, Embedding> embeddings_;  // by line id
  std::vector<WireDeltas::Delta> first_tokens_;
  std::deque<runtime::StepSample> samples_;  // prefilled elsewhere: their first token, not yet streamed
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> remote_;  // by request: (prompt tokens a prefill rank
                                                                       // computed, KV blocks moved)
  int group_width_ = 1;
  double busy_s_ = 0;
  int64_t kv_bytes_ = 0;
  std::map<int, std::pair<int64_t, double>> kv_to_;  // destination rank -> bytes, seconds
  double kv_seconds_ = 0, kv_wait_s_ = 0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace tandem::service
