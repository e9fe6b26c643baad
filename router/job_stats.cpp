#include "router/job_stats.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <climits>
#include <cmath>
#include <string_view>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "router/hosts.h"
#include "runtime/cpu/expert_parallel.h"

namespace tandem::router {

namespace {
constexpr double kBucketGrowth = 1.01;  // each bucket 1% wider than the last
const double kLogGrowth = std::log(kBucketGrowth);
}  // namespace

void Quantiles::add(double v) {
  const int32_t b = v > 0 ? static_cast<int32_t>(std::floor(std::log(v) / kLogGrowth)) : INT32_MIN;
  ++buckets_[b];
  min_ = count_ == 0 ? v : std::min(min_, v);
  max_ = count_ == 0 ? v : std::max(max_, v);
  ++count_;
}

double Quantiles::at_rank(int64_t rank) const {
  if (rank <= 0) return min_;
  if (rank >= count_ - 1) return max_;
  int64_t seen = 0;
  for (const auto& [b, n] : buckets_) {
    seen += n;
    if (rank < seen) {
      if (b == INT32_MIN) return std::min(0.0, max_);
      // The bucket [g^b, g^(b+1)): its middle in log space, within the exact extremes.
      return std::clamp(std::exp((b + 0.5) * kLogGrowth), min_, max_);
    }
  }
  return max_;
}

double Quantiles::percentile(double p) const {
  if (count_ == 0) return 0;
  const double pos = p / 100.0 * static_cast<double>(count_ - 1);
  const auto lo = static_cast<int64_t>(pos);
  const double a = at_rank(lo);
  if (lo + 1 >= count_) return a;
  return a + (at_rank(lo + 1) - a) * (pos - static_cast<double>(lo));
}

void JobStats::request_ok(int64_t prompt_tokens, int64_t generated, double ttft_ms, double itl_ms, double e2e_ms) {
  ++ok_;
  prompt_tokens_ += prompt_tokens;
  generated_ += generated;
  ttft_.add(ttft_ms);
  if (generated > 1) itl_.add(itl_ms);
  e2e_.add(e2e_ms);
}

namespace {

double gbps(double bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0.0; }

// The job's tiers, summed over the worker ranks: why prompt tokens were not computed, and what moved.
nlohmann::json tier_summary(const std::vector<RankReport>& ranks) {
  std::array<int64_t, 3> hits{};
  kv::TierStats t;
  for (const auto& r : ranks) {
    for (int i = 0; i < 3; ++i) hits[static_cast<std::size_t>(i)] += r.hit_tokens_by_tier[static_cast<std::size_t>(i)];
    // Counters add up; what every rank sees alike (the store at open, flags) does not.
    kv::TierStats::each_field([&](std::string_view name, auto member) {
      auto& sum = t.*member;
      const auto& v = r.tiers.*member;
      if constexpr (std::is_same_v<std::remove_reference_t<decltype(sum)>, bool>) sum = sum || v;
      else if (name.starts_with("store_")) sum = std::max(sum, v);
      else sum += v;
    });
  }
  return {{"hit_tokens", {{"device", hits[0]}, {"host", hits[1]}, {"disk", hits[2]}}},
          {"host", {{"offloaded_blocks", t.host_offloaded},
                    {"onboarded_blocks", t.host_onboarded},
                    {"bytes", t.host_bytes},
                    {"gbps", gbps(t.host_bytes, t.host_seconds)}}},
          {"disk", {{"enabled", t.store_enabled},
                    {"writable", t.store_writable},
                    {"blocks_at_open", t.store_blocks_at_open},
                    {"files_at_open", t.store_files_at_open},
                    {"read_blocks", t.disk_read},
                    {"read_failed", t.disk_read_failed},
                    {"onboarded_blocks", t.disk_onboarded},
                    {"read_gbps", gbps(t.disk_read_bytes, t.disk_read_seconds)},
                    {"written_blocks", t.disk_written},
                    {"write_dropped", t.disk_write_dropped},
                    {"pruned_files", t.store_pruned_files},
                    {"written_bytes", t.disk_write_bytes},
                    {"write_gbps", gbps(t.disk_write_bytes, t.disk_write_seconds)}}}};
}

}  // namespace

nlohmann::json JobStats::summary(double elapsed_s) const {
  auto dist = [](const Quantiles& q) {
    return nlohmann::json{{"p50", q.percentile(50)}, {"p90", q.percentile(90)}, {"p99", q.percentile(99)}};
  };
  int64_t computed = 0, hits = 0, kv_bytes = 0;
  double kv_seconds = 0;
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : ranks_) {
    computed += r.prefill_tokens;
    hits += r.prefix_hit_tokens;
    kv_bytes += r.kv_bytes_sent;
    kv_seconds += r.kv_send_seconds;
    ranks.push_back({{"rank", r.rank},
                     {"role", std::string(service::role_name(r.role))},
                     {"tensor_parallel_ranks", r.tp},
                     {"busy_fraction", r.busy_fraction},
                     {"prefill_tokens", r.prefill_tokens},
                     {"decode_tokens", r.decode_tokens},
                     {"prefix_hit_tokens", r.prefix_hit_tokens},
                     {"kv_bytes_sent", r.kv_bytes_sent},
                     {"kv_send_s", r.kv_send_seconds},
                     {"kv_wait_s", r.kv_wait_seconds},
                     {"preemptions", r.preemptions},
                     {"hit_tokens_by_tier", r.hit_tokens_by_tier},
                     {"kv_tiers", service::tiers_json(r.tiers)}});
    if (static_cast<std::size_t>(r.rank) < hosts_.size()) ranks.back()["host"] = hosts_[static_cast<std::size_t>(r.rank)];
  }
  const double secs = std::max(elapsed_s, 1e-9);
  nlohmann::json out = {{"requests_ok", ok_},
          {"requests_failed", failed_},
          {"elapsed_s", elapsed_s},
          {"requests_per_s", static_cast<double>(ok_) / secs},
          {"prompt_tokens", prompt_tokens_},
          {"prompt_tokens_computed", computed},
          {"generated_tokens", generated_},
          {"output_tokens_per_s", static_cast<double>(generated_) / secs},
          {"ttft_ms", dist(ttft_)},
          {"itl_ms", dist(itl_)},
          {"e2e_ms", dist(e2e_)},
          {"prefix_hit_rate", prompt_tokens_ > 0 ? static_cast<double>(hits) / static_cast<double>(prompt_tokens_) : 0.0},
          {"kv_bytes_transferred", kv_bytes},
          {"kv_transfer_gbps", kv_seconds > 0 ? static_cast<double>(kv_bytes) / kv_seconds / 1e9 : 0.0},
          {"kv_tiers", tier_summary(ranks_)},
          {"ranks", ranks}};
  if (!hosts_.empty()) node_summary(out);
  expert_summary(out);
  return out;
}

// "experts" (a mixture of experts): the rows routed to each expert of each
// MoE layer over the job, each layer's hottest expert against the mean (1:
// even), the busiest worker's share of all routed rows, and with experts
// placed on a worker's ranks (expert parallelism) the busiest such rank's
// share of its worker's rows, the largest over such workers (1 / ranks:
// even; 1 without).
void JobStats::expert_summary(nlohmann::json& out) const {
  int64_t experts = 0;
  std::vector<int64_t> sum;
  std::vector<int64_t> per_rank;
  int widest = 1;
  double busiest_rank = 0;
  for (const auto& r : ranks_) {
    if (r.expert_tokens.empty()) continue;
    experts = r.experts;
    if (sum.size() < r.expert_tokens.size()) sum.resize(r.expert_tokens.size());
    int64_t mine = 0;
    const int w = std::max(1, r.expert_ranks);
    const std::vector<int64_t> by_rank = runtime::cpu::rows_by_rank(r.expert_tokens, experts, w);
    for (std::size_t i = 0; i < r.expert_tokens.size(); ++i) sum[i] += r.expert_tokens[i], mine += r.expert_tokens[i];
    per_rank.push_back(mine);
    widest = std::max(widest, w);
    if (mine > 0 && w > 1)
      busiest_rank = std::max(busiest_rank, static_cast<double>(*std::max_element(by_rank.begin(), by_rank.end())) /
                                                static_cast<double>(mine));
  }
  if (experts <= 0 || sum.empty()) return;
  nlohmann::json layers = nlohmann::json::array(), hottest = nlohmann::json::array();
  int64_t total = 0;
  for (std::size_t l = 0; l * static_cast<std::size_t>(experts) < sum.size(); ++l) {
    const auto first = sum.begin() + static_cast<std::ptrdiff_t>(l * static_cast<std::size_t>(experts));
    const std::vector<int64_t> row(first, first + experts);
    const int64_t n = std::accumulate(row.begin(), row.end(), int64_t{0});
    total += n;
    layers.push_back(row);
    hottest.push_back(n > 0 ? static_cast<double>(*std::max_element(row.begin(), row.end())) * static_cast<double>(experts) /
                                  static_cast<double>(n)
                            : 0.0);
  }
  const int64_t busiest = *std::max_element(per_rank.begin(), per_rank.end());
  out["experts"] = {{"experts_per_layer", experts},
                    {"tokens_per_expert", layers},
                    {"hottest_over_mean", hottest},
                    {"busiest_worker_share", total > 0 ? static_cast<double>(busiest) / static_cast<double>(total) : 0.0},
                    {"expert_parallel_ranks", widest},
                    {"busiest_rank_share", widest > 1 ? busiest_rank : 1.0}};
}

// "nodes": each host's ranks, in rank order; "kv_between_nodes" and
// "kv_within_node": what the workers sent, by where the destination ran.
void JobStats::node_summary(nlohmann::json& out) const {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& [host, ranks] : ranks_by_host(hosts_)) nodes.push_back({{"host", host}, {"ranks", ranks}});
  std::array<int64_t, 2> bytes{};  // [within, between]
  std::array<double, 2> seconds{};
  auto host = [this](int rank) { return static_cast<std::size_t>(rank) < hosts_.size() ? hosts_[static_cast<std::size_t>(rank)] : ""; };
  for (const auto& r : ranks_)
    for (const auto& to : r.kv_sent_to) {
      const std::size_t between = host(r.rank) != host(to.rank) ? 1 : 0;
      bytes[between] += to.bytes;
      seconds[between] += to.seconds;
    }
  auto kv = [&](std::size_t i) {
    return nlohmann::json{{"bytes", bytes[i]},
                          {"gbps", seconds[i] > 0 ? static_cast<double>(bytes[i]) / seconds[i] / 1e9 : 0.0}};
  };
  out["nodes"] = nodes;
  out["kv_within_node"] = kv(0);
  out["kv_between_nodes"] = kv(1);
}

nlohmann::json JobStats::write_batch_summary(const std::string& path, double elapsed_s, const BatchEnd& end) const {
  nlohmann::json out = summary(elapsed_s);
  out["requests_resumed"] = end.resumed;
  if (end.planner)
    for (const auto& [key, value] : end.planner->items()) out[key] = value;
  out["stopped_by_signal"] = end.stopped_by_signal;
  out["requests_abandoned"] = end.abandoned;
  out["input_format"] = end.input_format;
  if (!end.kernels.empty()) out["kernels"] = end.kernels;
  // Rank 0's memory does not grow with the input (docs/run.md): its peak, for anyone to check.
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) out["router_peak_rss_bytes"] = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  if (!end.input_error.empty()) out["input_error"] = end.input_error;
  std::ofstream f(path);
  if (!f) throw Error(path + ": cannot write the summary");
  f << out.dump(2) << "\n";
  return out;
}

}  // namespace tandem::router
