// The protocol of a job: the messages between rank 0 and the workers (and
// between workers), their types, and their codec (CBOR), in one place, so
// every rank agrees. No MPI here: a link carries the bytes (mpi_transport's
// MPI links, or an in-process one), and MsgType is the MPI tag.
//
// kProtocolVersion changes whenever a message changes; every rank checks at
// start-up that all run the same protocol (and the same build).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/step_shape.h"
#include "topology/side.h"

#include <nlohmann/json_fwd.hpp>

#include "kv/tiers.h"
#include "runtime/engine/engine.h"

namespace tandem::service {

constexpr int kProtocolVersion = 12;

// One message type per handler. Values are MPI tags (1..31; mpi_transport
// keeps its own transport tags apart, from 100 up).
enum class MsgType : int {
  kRequest = 1,      // rank 0 -> worker: a request to run (WireRequest)
  kResult = 2,       // worker -> rank 0: a finished request (WireResult)
  kShutdown = 3,     // rank 0 -> worker: no more requests; report and exit (one byte: abandon)
  kReport = 4,       // worker -> rank 0: the worker's final counters (RankReport)
  kPrefill = 5,      // decode rank -> prefill rank: prefill this into these blocks of mine (WirePrefill)
  kCancel = 9,       // rank 0 -> worker, or prefill rank -> decode rank: drop a request (its id)
  kCacheEvents = 10, // worker -> rank 0: prefix-cache hashes stored and removed (WireCacheEvents)
  kDeltas = 11,      // worker -> rank 0: tokens of streaming requests, one message per step (WireDeltas)
  kStats = 12,       // worker -> rank 0: counters now (the first one also says "loaded") (RankReport)
  kRoles = 13,       // rank 0 -> workers: the next epoch's prefill ranks (WireRoles)
  // Inside a tensor-parallel group (group_worker.h): its leader -> each follower, in order.
  kGroupForward = 14,    // run this forward pass on your shard (encode_forward)
  kGroupPostKv = 15,     // post your shard of these blocks to your peer in the destination group (WireGroupPost)
  kGroupReleaseKv = 16,  // the leader's transfer ended: end yours before the next command (its id)
  kGroupAwaitKv = 17,    // a transfer landed on the leader: wait for your shard of it (WireGroupAwait)
  kGroupStop = 18,       // the end of the job
  kGroupSaveBlocks = 19, // the tiers below the leader's pool take these blocks: send your shards (encode_blocks)
  kGroupLoadBlocks = 20, // the tiers below filled these blocks: take your shards (encode_blocks)
  // Re-splits that change a worker's width (prefill_tp != decode_tp under job.mode = "auto").
  kRegroup = 21,     // rank 0 -> a leader of a cell that changes: finish what you hold, then regroup (WireRoles)
  kGroupMap = 22,    // rank 0 -> leaders (-> their followers): the workers as they stand now (WireGroupMap)
  kGroupMapAck = 23, // leader -> rank 0: that map is in use here (its serial)
  kPing = 24,        // rank 0 -> worker: rank 0 is alive (empty); a worker that hears nothing from rank 0 for
                     // job.worker_timeout_seconds ends itself (its node was cut off)
};
std::string_view msg_type_name(MsgType t);
constexpr int tag_of(MsgType t) { return static_cast<int>(t); }

// A rank's part in the current epoch: a worker prefills and decodes
// (aggregated), or only prefills, or only decodes (disaggregated); rank 0
// routes (and reports its own counters too).
enum class Role : uint8_t { kWorker = 0, kPrefill = 1, kDecode = 2, kRouter = 3 };
std::string_view role_name(Role r);
constexpr Role role_for(bool disaggregated, topology::Side side) {
  return !disaggregated ? Role::kWorker : side == topology::Side::kPrefill ? Role::kPrefill : Role::kDecode;
}

// What a rank reports of itself: periodically (kStats) and at the end (kReport).
struct RankReport {
  int rank = 0;
  Role role = Role::kWorker;
  int tp = 1;                 // the ranks of this worker: a tensor-parallel group's leader reports for the group
  double busy_fraction = 0;   // share of the job's wall time spent computing
  int64_t prefill_tokens = 0; // prompt tokens this rank computed
  int64_t decode_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t kv_bytes_sent = 0;
  double kv_send_seconds = 0;   // summed over transfers, post to done (a transfer's latency, not time spent waiting)
  // The same by destination worker (its first rank): rank 0 tells transfers between nodes from those within one.
  struct KvTo {
    int rank = 0;
    int64_t bytes = 0;
    double seconds = 0;
  };
  std::vector<KvTo> kv_sent_to;
  double kv_wait_seconds = 0;   // time spent inside the KV transport's calls (what transfers cost this rank's loop)
  int64_t preemptions = 0;
  int64_t kv_blocks_used = 0;   // KV blocks held by sequences now (cached-but-free blocks excluded)
  int64_t kv_blocks_total = 0;
  // Prompt tokens taken from cached KV instead of computed, by where the
  // blocks were: the pool (device), host memory, the disk store.
  std::array<int64_t, 3> hit_tokens_by_tier{};
  kv::TierStats tiers;  // blocks and bytes moved between tiers
  // Engine steps since the last report, for the planner's fit: prefill tokens,
  // prefill context, decode sequences, decode context, logit rows, seconds.
  std::vector<runtime::StepSample> step_samples;
  // A mixture of experts: the rows this worker routed to each expert so far
  // ([MoE layer][expert], flattened: ModelBackend::expert_tokens), of `experts` per layer.
  int64_t experts = 0;
  std::vector<int64_t> expert_tokens;
  int expert_ranks = 1;  // the group's ranks its experts are placed on, whole (ModelBackend::expert_ranks)
};

// The tier counters as JSON (summary, wire) and back.
nlohmann::json tiers_json(const kv::TierStats& t);
kv::TierStats tiers_from_json(const nlohmann::json& j);

// Rank 0 -> decode (or agg) worker.
struct WireRequest {
  uint64_t id = 0;             // the input line's index
  std::vector<int32_t> prompt;
  runtime::SamplingParams params;
  uint64_t rng_key = 0;
  int prefill_rank = -1;       // disagg: the worker rank that prefills it; -1: prefill locally
  bool stream = false;         // send its tokens as they come (WireDeltas)
  // An embedding line (runtime::Pooling, not kNone): `inputs` are its
  // prompts, each pooled on its own; `prompt` is empty. Its result carries
  // every input's vector, in order.
  uint8_t pooling = 0;
  std::vector<std::vector<int32_t>> inputs;
};

// Worker -> rank 0, once per step with any: new tokens of streaming requests.
// The finished result stays authoritative (text cut at a stop string).
struct WireDeltas {
  struct Delta {
    uint64_t id = 0;
    std::vector<int32_t> tokens;
  };
  std::vector<Delta> deltas;
};

// Worker -> rank 0.
struct WireResult {
  uint64_t id = 0;
  bool ok = true;
  std::string error;            // when !ok: why the worker refused it
  std::vector<int32_t> tokens;
  std::string text;
  std::string finish_reason;
  std::vector<runtime::PositionLogprobs> logprobs, prompt_logprobs;
  double ttft_s = 0, e2e_s = 0;
  int64_t prompt_tokens_computed = 0;
  int64_t kv_blocks_moved = 0;  // blocks of its prompt that crossed the transport
  int worker = 0;
  std::vector<float> embedding;  // an embedding line: [inputs][hidden], pooled, not normalised
};

// Decode rank -> prefill rank: prefill this request into these blocks of mine.
struct WirePrefill {
  WireRequest request;
  std::vector<int32_t> dst_blocks;  // for the prompt's blocks from skip_blocks on
  int decode_rank = 0;              // world rank
  int64_t skip_blocks = 0;          // leading blocks the decode rank has cached: not sent
};

// Prefill rank -> decode rank: the notification of the KV transfer into
// dst_blocks, which the decode rank receives once the blocks are in place.
struct WireKvReady {
  uint64_t id = 0;
  runtime::PrefillHandoff handoff;
  int64_t prompt_tokens_computed = 0;
};

// Worker -> rank 0: what its prefix cache gained and lost (for KV-aware
// routing), in its pool and in host memory, and what it added to the disk
// store (the first worker also sends the store's whole index once: any
// worker can read it).
struct WireCacheEvents {
  int rank = 0;
  std::vector<uint64_t> stored, removed;
  std::vector<uint64_t> host_stored, host_removed;
  std::vector<uint64_t> disk_stored;
};

std::vector<uint8_t> encode(const WireDeltas& r);
WireDeltas decode_deltas(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode_cancel(uint64_t id);
uint64_t decode_cancel(const std::vector<uint8_t>& bytes);
// Rank 0 -> every worker at an epoch boundary: which ranks prefill from now on
// (empty: aggregated, every worker does both).
struct WireRoles {
  int64_t epoch = 0;
  std::vector<int> prefill_ranks;
};
std::vector<uint8_t> encode(const WireRoles& r);
WireRoles decode_roles(const std::vector<uint8_t>& bytes);
// Rank 0 -> every worker's leader after a cell regrouped: every worker that
// moves KV now, its ranks (the lowest leads) and its pool (blocks of
// block_bytes on each of its ranks); a rank of none of them moves none.
struct WireGroupMap {
  int64_t serial = 0;
  struct Group {
    bool prefill = false;
    std::vector<int> ranks;
    uint64_t block_bytes = 0;
    int64_t blocks = 0;
  };
  std::vector<Group> groups;
};
std::vector<uint8_t> encode(const WireGroupMap& r);
WireGroupMap decode_group_map(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode(const WireCacheEvents& r);
WireCacheEvents decode_cache_events(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode(const WirePrefill& r);
WirePrefill decode_prefill(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode(const WireKvReady& r);
WireKvReady decode_kv_ready(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode(const WireRequest& r);
WireRequest decode_request(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode(const WireResult& r);
WireResult decode_result(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode(const RankReport& r);
RankReport decode_report(const std::vector<uint8_t>& bytes);

// kGroupForward: a forward pass's chunks, flat (one goes to every follower at
// every step, so not CBOR). decode_forward's chunks view `ints`.
struct WireForward {
  std::vector<int32_t> ints;
  std::vector<runtime::SeqChunk> chunks;
};
std::vector<uint8_t> encode_forward(std::span<const runtime::SeqChunk> chunks);
void decode_forward(const std::vector<uint8_t>& bytes, WireForward& out);

// kGroupPostKv: the leader posted its shard of blocks src into `dest`'s (the
// destination group leader's world rank) blocks dst as transfer `id`.
struct WireGroupPost {
  int dest = 0;
  std::vector<int32_t> src, dst;
  std::vector<uint8_t> note;
  int64_t id = 0;
};
std::vector<uint8_t> encode(const WireGroupPost& r);
WireGroupPost decode_group_post(const std::vector<uint8_t>& bytes);
// kGroupAwaitKv: the leader's shard of a transfer from `source` (the sending
// group leader's world rank) with this note has landed (or was aborted).
struct WireGroupAwait {
  int source = 0;
  std::vector<uint8_t> note;
};
std::vector<uint8_t> encode(const WireGroupAwait& r);
WireGroupAwait decode_group_await(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode_id(int64_t id);
// kGroupSaveBlocks, kGroupLoadBlocks: block ids of the pool, flat.
std::vector<uint8_t> encode_blocks(std::span<const int32_t> blocks);
std::vector<int32_t> decode_blocks(const std::vector<uint8_t>& bytes);
int64_t decode_id(const std::vector<uint8_t>& bytes);

}  // namespace tandem::service
