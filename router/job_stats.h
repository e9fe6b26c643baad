// What rank 0 counts during a job, and the summary it writes at the end
// (logged, and saved as JSON next to the output).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/service/protocol.h"

namespace tandem::router {

using service::RankReport;

// Percentiles of a latency without keeping every value (rank 0's memory
// must not grow with the input): counts in log-spaced buckets 1% wide, so a
// percentile is within 0.5% of the exact one's value; min and max exact.
class Quantiles {
 public:
  void add(double v);
  // p-th percentile (0..100), interpolated linearly between the
  // neighbouring ranks (numpy's default); 0 for no values.
  double percentile(double p) const;
  int64_t count() const { return count_; }

 private:
  double at_rank(int64_t rank) const;  // the rank-th smallest value (0-based), to the bucket's precision

  std::map<int32_t, int64_t> buckets_;  // log-bucket index -> values in it (values <= 0 at INT32_MIN)
  int64_t count_ = 0;
  double min_ = 0, max_ = 0;
};

class JobStats {
 public:
  void request_ok(int64_t prompt_tokens, int64_t generated, double ttft_ms, double itl_ms, double e2e_ms);
  void request_failed() { ++failed_; }
  void add_rank(const RankReport& r) { ranks_.push_back(r); }
  // Each world rank's host (empty: one process): the summary then lists the
  // ranks of each node and tells KV sent between nodes from KV within one.
  void set_hosts(std::vector<std::string> hosts) { hosts_ = std::move(hosts); }

  int64_t ok() const { return ok_; }
  int64_t failed() const { return failed_; }
  int64_t generated_tokens() const { return generated_; }

  // The summary; elapsed_s is the job's wall time.
  nlohmann::json summary(double elapsed_s) const;

  // How a batch job ended, beside its counters: the summary's other fields.
  struct BatchEnd {
    int64_t resumed = 0;  // lines an earlier run answered
    bool stopped_by_signal = false;
    int64_t abandoned = 0;  // requests in flight when the drain ran out
    std::string input_format, input_error;
    std::string kernels;  // the workers' CPU kernel table (which bits to expect), or their backend
    const nlohmann::json* planner = nullptr;  // "epochs" and "planner_profile" (job.mode = "auto")
  };
  // A batch job's summary (summary() with `end`'s fields and rank 0's peak
  // memory), written to `path`. Throws tandem::Error when it cannot be.
  nlohmann::json write_batch_summary(const std::string& path, double elapsed_s, const BatchEnd& end) const;

 private:
  int64_t ok_ = 0, failed_ = 0, prompt_tokens_ = 0, generated_ = 0;
  Quantiles ttft_, itl_, e2e_;
  void node_summary(nlohmann::json& out) const;
  void expert_summary(nlohmann::json& out) const;

  std::vector<RankReport> ranks_;
  std::vector<std::string> hosts_;
};



}  // namespace tandem::router
