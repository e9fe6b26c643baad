// Workloads for the simulator and the planner: requests with a prompt length
// (isl), an output length (osl), an arrival time and a shared-prefix group.
//
// A workload file is a list of phases run one after another:
//   seed = 1
//   [[phase]]
//   requests = 20000
//   isl = { dist = "lognormal", mean = 8000, sigma = 0.4 }   # or fixed / uniform
//   osl = { dist = "fixed", value = 200 }
//   shared_prefix_tokens = 0      # tokens every request of the phase shares
//   arrival = "batch"             # all known at t=0; or { rate = 50.0 } Poisson req/s
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tandem::planner {

struct Request {
  int64_t isl = 0;
  int64_t osl = 0;
  double arrival_s = 0;
  int64_t prefix_tokens = 0;  // leading tokens shared with every request of its group
  int32_t prefix_group = -1;  // -1: none
};

struct Distribution {
  std::string dist = "fixed";  // fixed | uniform | lognormal
  double value = 0, min = 0, max = 0, mean = 0, sigma = 0;
};

struct Phase {
  int64_t requests = 0;
  Distribution isl, osl;
  int64_t shared_prefix_tokens = 0;
  double rate = 0;  // requests/s (Poisson); 0: batch, all known when the phase starts
};

struct WorkloadSpec {
  uint64_t seed = 1;
  std::vector<Phase> phases;
  static WorkloadSpec load(const std::filesystem::path& file);  // throws tandem::Error, file:line
  // The requests, in order; lengths at least 1, isl at most max_len - 1 and isl + osl at most max_len.
  std::vector<Request> generate(int64_t max_len) const;
};

}  // namespace tandem::planner
