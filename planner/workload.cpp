#include "planner/workload.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/error.h"

namespace tandem::planner {
namespace {

std::string where(const std::filesystem::path& f, const toml::node& n) {
  return f.string() + ":" + std::to_string(n.source().begin.line);
}

Distribution distribution(const std::filesystem::path& f, const toml::node_view<const toml::node>& v, const char* name) {
  const auto* t = v.as_table();
  if (!t) throw Error(f.string() + ": phase." + name + " must be a table like { dist = \"fixed\", value = 512 }");
  Distribution d;
  d.dist = (*t)["dist"].value_or(std::string());
  auto num = [&](const char* key) {
    auto x = (*t)[key].value<double>();
    if (!x) throw Error(where(f, *t) + ": " + name + " with dist = \"" + d.dist + "\" needs '" + key + "' (a number)");
    return *x;
  };
  if (d.dist == "fixed") {
    d.value = num("value");
  } else if (d.dist == "uniform") {
    d.min = num("min");
    d.max = num("max");
    if (d.max < d.min) throw Error(where(f, *t) + ": " + name + ": max must be at least min");
  } else if (d.dist == "lognormal") {
    d.mean = num("mean");
    d.sigma = num("sigma");
    if (d.mean <= 0 || d.sigma < 0) throw Error(where(f, *t) + ": " + name + ": mean must be above 0, sigma at least 0");
  } else {
    throw Error(where(f, *t) + ": " + name + ": dist must be \"fixed\", \"uniform\" or \"lognormal\"");
  }
  return d;
}

double draw(const Distribution& d, std::mt19937_64& rng) {
  if (d.dist == "fixed") return d.value;
  if (d.dist == "uniform") return std::uniform_real_distribution<double>(d.min, d.max)(rng);
  // Lognormal with the given mean: mu chosen so that E[x] = mean.
  const double mu = std::log(d.mean) - d.sigma * d.sigma / 2;
  return std::lognormal_distribution<double>(mu, d.sigma)(rng);
}

}  // namespace

WorkloadSpec WorkloadSpec::load(const std::filesystem::path& file) {
  toml::table t;
  try {
    t = toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    throw Error(file.string() + ":" + std::to_string(e.source().begin.line) + ": " + std::string(e.description()));
  }
  WorkloadSpec w;
  w.seed = static_cast<uint64_t>(t["seed"].value_or(int64_t{1}));
  const auto* phases = t["phase"].as_array();
  if (!phases || phases->empty()) throw Error(file.string() + ": no [[phase]] tables; a workload needs at least one");
  for (const auto& node : *phases) {
    const auto* p = node.as_table();
    if (!p) throw Error(file.string() + ": every [[phase]] must be a table");
    Phase ph;
    auto n = (*p)["requests"].value<int64_t>();
    if (!n || *n < 1) throw Error(where(file, *p) + ": phase needs 'requests' (an integer at least 1)");
    ph.requests = *n;
    ph.isl = distribution(file, (*p)["isl"], "isl");
    ph.osl = distribution(file, (*p)["osl"], "osl");
    ph.shared_prefix_tokens = (*p)["shared_prefix_tokens"].value_or(int64_t{0});
    if (auto a = (*p)["arrival"]; a.is_string()) {
      if (a.value_or(std::string()) != "batch")
        throw Error(where(file, *p) + ": arrival must be \"batch\" or { rate = R } (requests per second)");
    } else if (const auto* at = a.as_table()) {
      auto r = (*at)["rate"].value<double>();
      if (!r || *r <= 0) throw Error(where(file, *p) + ": arrival.rate must be a number above 0");
      ph.rate = *r;
    }
    for (const auto& [k, v] : *p) {
      const std::string key(k.str());
      if (key != "requests" && key != "isl" && key != "osl" && key != "shared_prefix_tokens" && key != "arrival")
        throw Error(where(file, *p) + ": unknown key '" + key + "' in [[phase]]");
    }
    w.phases.push_back(ph);
  }
  return w;
}

std::vector<Request> WorkloadSpec::generate(int64_t max_len) const {
  std::mt19937_64 rng(seed);
  std::vector<Request> out;
  double t = 0;
  for (std::size_t pi = 0; pi < phases.size(); ++pi) {
    const Phase& p = phases[pi];
    const double start = t;
    std::exponential_distribution<double> gap(p.rate > 0 ? p.rate : 1.0);
    for (int64_t i = 0; i < p.requests; ++i) {
      Request r;
      r.isl = std::clamp<int64_t>(std::llround(draw(p.isl, rng)), 1, max_len - 1);
      r.osl = std::clamp<int64_t>(std::llround(draw(p.osl, rng)), 1, max_len - r.isl);
      if (p.rate > 0) t += gap(rng);
      r.arrival_s = p.rate > 0 ? t : start;
      if (p.shared_prefix_tokens > 0) {
        r.prefix_tokens = std::min(p.shared_prefix_tokens, r.isl);
        r.prefix_group = static_cast<int32_t>(pi);
      }
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace tandem::planner
