// The messages of a run between rank 0 and the workers, as CBOR bytes.
// One place converts engine types to and from the wire, so every rank agrees.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "router/job_stats.h"
#include "runtime/engine/engine.h"

namespace tandem::launcher {

// Rank 0 -> decode (or agg) worker.
struct WireRequest {
  uint64_t id = 0;             // the input line's index
  std::vector<int32_t> prompt;
  runtime::SamplingParams params;
  uint64_t rng_key = 0;
  int prefill_rank = -1;       // disagg: the worker rank that prefills it; -1: prefill locally
  bool stream = false;         // send its tokens as they come (WireDeltas)
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
};

// Decode rank -> prefill rank: prefill this request into these blocks of mine.
struct WirePrefill {
  WireRequest request;
  std::vector<int32_t> dst_blocks;  // for the prompt's blocks from skip_blocks on
  int decode_rank = 0;              // world rank
  int64_t skip_blocks = 0;          // leading blocks the decode rank has cached: not sent
};

// Prefill rank -> decode rank, after the KV has landed in dst_blocks.
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
std::vector<uint8_t> encode(const router::RankReport& r);
router::RankReport decode_report(const std::vector<uint8_t>& bytes);

}  // namespace tandem::launcher
