// The summary's latency percentiles come from a sketch of bounded size,
// within 1% of the exact percentiles, whatever the number of requests.
#include <algorithm>
#include <random>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "router/job_stats.h"

using tandem::router::Quantiles;

namespace {
double exact(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}
}  // namespace

TEST_CASE("latency percentiles within 1% of the exact ones, in bounded memory", "[router][stats]") {
  std::mt19937 rng(3);
  std::lognormal_distribution<double> ms(3.0, 1.5);
  Quantiles q;
  std::vector<double> all;
  for (int i = 0; i < 200000; ++i) {
    const double v = ms(rng);
    q.add(v);
    all.push_back(v);
  }
  for (double p : {0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0}) {
    INFO("p" << p);
    CHECK(q.percentile(p) == Approx(exact(all, p)).epsilon(0.01));
  }
  CHECK(q.percentile(0) == exact(all, 0));  // the extremes are exact
  CHECK(q.percentile(100) == exact(all, 100));
  Quantiles few;
  CHECK(few.percentile(50) == 0);
  few.add(4);
  CHECK(few.percentile(99) == 4);
  few.add(0);  // a zero (an instant first token) has its own bucket
  CHECK(few.percentile(0) == 0);
  CHECK(few.percentile(50) == Approx(2).epsilon(0.01));
}

TEST_CASE("the summary lists each node's ranks and tells KV between nodes from KV within one", "[router][stats]") {
  tandem::router::JobStats stats;
  tandem::service::RankReport prefill;
  prefill.rank = 1;
  prefill.kv_bytes_sent = 3000;
  prefill.kv_sent_to = {{2, 1000, 0.5}, {3, 2000, 1e-6}};  // rank 2 on its node, rank 3 on another
  tandem::service::RankReport decode;
  decode.rank = 2;
  stats.add_rank(prefill);
  stats.add_rank(decode);
  CHECK_FALSE(stats.summary(1.0).contains("nodes"));  // one process: no hosts, no node sections
  stats.set_hosts({"a", "b", "b", "c"});
  const auto s = stats.summary(1.0);
  CHECK(s["nodes"].dump() == R"([{"host":"a","ranks":[0]},{"host":"b","ranks":[1,2]},{"host":"c","ranks":[3]}])");
  CHECK(s["kv_within_node"]["bytes"] == 1000);
  CHECK(s["kv_between_nodes"]["bytes"] == 2000);
  CHECK(s["kv_between_nodes"]["gbps"].get<double>() == Approx(2.0));
  CHECK(s["ranks"][0]["host"] == "b");
}
