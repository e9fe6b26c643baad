// Which rank runs where, as rank 0 tells users: every rank's host, by rank
// (MPI_Get_processor_name, gathered at start-up; empty in one process).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tandem::router {

// "2 (on node3)", or "2" when the host is unknown.
inline std::string rank_on_host(int rank, const std::vector<std::string>& hosts) {
  const auto r = static_cast<std::size_t>(rank);
  return std::to_string(rank) + (r < hosts.size() ? " (on " + hosts[r] + ")" : "");
}

// Each host with its ranks, in the order hosts first appear.
inline std::vector<std::pair<std::string, std::vector<int>>> ranks_by_host(const std::vector<std::string>& hosts) {
  std::vector<std::pair<std::string, std::vector<int>>> nodes;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    const std::string& h = hosts[static_cast<std::size_t>(r)];
    std::size_t i = 0;
    while (i < nodes.size() && nodes[i].first != h) ++i;
    if (i == nodes.size()) nodes.push_back({h, {}});
    nodes[i].second.push_back(r);
  }
  return nodes;
}

// Each rank's node as a number (0 for the first host to appear, ...), by rank.
inline std::vector<int> node_numbers(const std::vector<std::string>& hosts) {
  std::vector<int> out(hosts.size());
  int node = 0;
  for (const auto& [host, ranks] : ranks_by_host(hosts)) {
    for (int r : ranks) out[static_cast<std::size_t>(r)] = node;
    ++node;
  }
  return out;
}

}  // namespace tandem::router
