// Prometheus metrics of the HTTP shim, rendered in the text exposition format
// (version 0.0.4). Names follow Prometheus' rules: `tandem_` prefix, base
// units (seconds, bytes), `_total` on counters. Thread-safe: HTTP threads and
// the router thread update it; /metrics renders it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kv/tiers.h"

namespace tandem::router {

class Metrics {
 public:
  Metrics();

  // A finished HTTP request of `endpoint` ("completions", "chat", "models", …) with its status code.
  void request(const std::string& endpoint, int status);
  // A generation that completed (per choice): its latencies and token counts.
  void generation(double ttft_s, double itl_s, double e2e_s, int64_t prompt_tokens, int64_t generated_tokens,
                  int64_t prompt_tokens_computed);
  void set_in_flight(int64_t requests, int64_t waiting);
  struct Rank {
    int rank = 0;
    std::string role;
    int64_t kv_blocks_used = 0, kv_blocks_total = 0, kv_bytes_sent = 0, prefix_hit_tokens = 0;
    std::array<int64_t, 3> hit_tokens_by_tier{};  // device, host, disk
    kv::TierStats tiers;
    // A mixture of experts: rows per expert ([MoE layer][expert], `experts` a layer), experts on `expert_ranks` ranks.
    int64_t experts = 0;
    std::vector<int64_t> expert_tokens;
    int expert_ranks = 1;
  };
  void set_rank(const Rank& r);
  void set_workers_loaded(int64_t loaded, int64_t total);

  std::string render() const;

 private:
  struct Histogram {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // per bound, not cumulative; the last is +Inf
    double sum = 0;
    uint64_t count = 0;
    void observe(double v);
  };
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram ttft_, itl_, e2e_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0, prompt_tokens_computed_ = 0;
  int64_t in_flight_ = 0, waiting_ = 0;
  std::map<int, Rank> ranks_;
  int64_t loaded_ = 0, workers_ = 0;
};

}  // namespace tandem::router
