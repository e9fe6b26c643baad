#include "topology/group_map.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace tandem::topology {

namespace {

// Groups of `width` consecutive ranks from `first` up to `last`.
std::vector<std::vector<int>> in_rank_order(int first, int last, int width) {
  std::vector<std::vector<int>> out;
  width = std::max(1, width);
  for (int r = first; r + width - 1 <= last; r += width) {
    std::vector<int> g;
    for (int k = 0; k < width; ++k) g.push_back(r + k);
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace

GroupMap::GroupMap(int prefill_ranks, int prefill_tp, int decode_ranks, int decode_tp)
    : GroupMap(in_rank_order(1, prefill_ranks, prefill_tp),
               in_rank_order(prefill_ranks + 1, prefill_ranks + decode_ranks, decode_tp)) {}

GroupMap::GroupMap(std::vector<std::vector<int>> prefill, std::vector<std::vector<int>> decode) {
  auto by_leader = [](const std::vector<int>& a, const std::vector<int>& b) { return a.front() < b.front(); };
  for (auto* side : {&prefill, &decode}) {
    for (auto& g : *side) std::sort(g.begin(), g.end());
    std::erase_if(*side, [](const std::vector<int>& g) { return g.empty(); });
    std::sort(side->begin(), side->end(), by_leader);
  }
  prefill_groups_ = static_cast<int>(prefill.size());
  groups_ = std::move(prefill);
  groups_.insert(groups_.end(), decode.begin(), decode.end());
  for (std::size_t i = 0; i < groups_.size(); ++i)
    for (int r : groups_[i]) {
      if (r >= static_cast<int>(group_of_.size())) group_of_.resize(static_cast<std::size_t>(r) + 1, -1);
      group_of_[static_cast<std::size_t>(r)] = static_cast<int>(i);
    }
}

const std::vector<int>* GroupMap::group_at(int rank) const {
  const auto r = static_cast<std::size_t>(rank);
  if (rank < 0 || r >= group_of_.size() || group_of_[r] < 0) return nullptr;
  return &groups_[static_cast<std::size_t>(group_of_[r])];
}

int GroupMap::width_at(int rank) const {
  const auto* g = group_at(rank);
  return g ? static_cast<int>(g->size()) : 1;
}

int GroupMap::leader_of(int rank) const {
  const auto* g = group_at(rank);
  return g ? g->front() : rank;
}

int GroupMap::place_of(int rank) const {
  const auto* g = group_at(rank);
  return g ? static_cast<int>(std::find(g->begin(), g->end(), rank) - g->begin()) : 0;
}

int GroupMap::member(int leader, int place) const {
  const auto* g = group_at(leader);
  return g ? g->at(static_cast<std::size_t>(place)) : leader;
}

std::vector<int> GroupMap::members(int rank) const {
  const auto* g = group_at(rank);
  return g ? *g : std::vector<int>{rank};
}

Side GroupMap::side_at(int rank) const {
  const auto r = static_cast<std::size_t>(rank);
  const bool prefill = rank >= 0 && r < group_of_.size() && group_of_[r] >= 0 && group_of_[r] < prefill_groups_;
  return prefill ? Side::kPrefill : Side::kDecode;
}

std::vector<std::vector<int>> GroupMap::groups(Side side) const {
  const bool prefill = side == Side::kPrefill;
  const auto first = groups_.begin() + (prefill ? 0 : prefill_groups_);
  return {first, prefill ? groups_.begin() + prefill_groups_ : groups_.end()};
}

std::vector<int> GroupMap::leaders(Side side) const {
  const bool prefill = side == Side::kPrefill;
  std::vector<int> out;
  const std::size_t from = prefill ? 0 : static_cast<std::size_t>(prefill_groups_);
  const std::size_t to = prefill ? static_cast<std::size_t>(prefill_groups_) : groups_.size();
  for (std::size_t i = from; i < to; ++i) out.push_back(groups_[i].front());
  return out;
}

std::vector<int> GroupMap::leaders_by_node(const std::vector<std::string>& hosts) const {
  std::vector<int> all;
  for (const auto& g : groups_) all.push_back(g.front());
  std::sort(all.begin(), all.end());
  std::map<std::string, std::vector<int>> on;  // each node's leaders, in rank order
  for (int r : all) on[static_cast<std::size_t>(r) < hosts.size() ? hosts[static_cast<std::size_t>(r)] : ""].push_back(r);
  // The i-th of a node's n leaders sits at (i + 1/2) / n: merged by that key (then rank), every prefix is proportional.
  std::vector<std::pair<double, int>> keyed;
  for (const auto& [host, leaders] : on)
    for (std::size_t i = 0; i < leaders.size(); ++i)
      keyed.push_back({(static_cast<double>(i) + 0.5) / static_cast<double>(leaders.size()), leaders[i]});
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> out;
  for (const auto& [key, leader] : keyed) out.push_back(leader);
  return out;
}

std::vector<std::vector<int>> GroupMap::spanning(const std::vector<std::string>& hosts) const {
  std::vector<std::vector<int>> out;
  for (const auto& g : groups_) {
    std::set<std::string> on;
    for (int r : g)
      if (static_cast<std::size_t>(r) < hosts.size()) on.insert(hosts[static_cast<std::size_t>(r)]);
    if (on.size() > 1) out.push_back(g);
  }
  return out;
}

std::string GroupMap::describe(const std::vector<int>& ranks) {
  if (ranks.empty()) return "";
  bool consecutive = true;
  for (std::size_t i = 1; i < ranks.size(); ++i) consecutive = consecutive && ranks[i] == ranks[i - 1] + 1;
  if (consecutive)
    return ranks.size() == 1 ? std::to_string(ranks[0])
                             : std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

namespace {

// Each node's free ranks (of `ranks`), nodes in the order of their lowest rank.
std::vector<std::vector<int>> free_by_node(const std::vector<std::string>& hosts, const std::vector<int>& ranks) {
  std::vector<std::vector<int>> nodes;
  std::map<std::string, std::size_t> index;
  for (int r : ranks) {
    const std::string host = static_cast<std::size_t>(r) < hosts.size() ? hosts[static_cast<std::size_t>(r)] : "";
    auto [it, fresh] = index.try_emplace(host, nodes.size());
    if (fresh) nodes.emplace_back();
    nodes[it->second].push_back(r);
  }
  return nodes;
}

// `widths.size()` groups of those widths from `ranks`, in order: each from
// the first node with room for it, else (at the end) from what is left.
std::vector<std::vector<int>> fill(const std::vector<std::string>& hosts, const std::vector<int>& ranks,
                                   const std::vector<int>& widths) {
  auto nodes = free_by_node(hosts, ranks);
  std::vector<std::vector<int>> groups(widths.size());
  std::vector<std::size_t> unplaced;
  for (std::size_t i = 0; i < widths.size(); ++i) {
    const auto w = static_cast<std::size_t>(widths[i]);
    auto node = std::find_if(nodes.begin(), nodes.end(), [w](const std::vector<int>& n) { return n.size() >= w; });
    if (node == nodes.end()) {
      unplaced.push_back(i);
      continue;
    }
    groups[i].assign(node->begin(), node->begin() + static_cast<std::ptrdiff_t>(w));
    node->erase(node->begin(), node->begin() + static_cast<std::ptrdiff_t>(w));
  }
  std::vector<int> left;
  for (const auto& n : nodes) left.insert(left.end(), n.begin(), n.end());
  std::sort(left.begin(), left.end());
  std::size_t next = 0;
  for (std::size_t i : unplaced)
    for (int k = 0; k < widths[i]; ++k) groups[i].push_back(left[next++]);
  return groups;
}

std::vector<int> range(int first, int last) {
  std::vector<int> out;
  for (int r = first; r <= last; ++r) out.push_back(r);
  return out;
}

// Equal widths: every node's whole groups, then those of the ranks left
// over (spanning nodes); prefill's groups spread over the nodes in
// proportion to each node's groups (largest remainder, ties to the node of
// the lowest rank), each node's lowest groups prefilling.
GroupMap spread_roles(const std::vector<std::string>& hosts, const std::vector<int>& ranks, int width, int prefill_groups) {
  std::vector<std::vector<std::vector<int>>> on;  // groups per node; the last: those that span nodes
  std::vector<int> left;
  for (const auto& node : free_by_node(hosts, ranks)) {
    on.emplace_back();
    std::size_t i = 0;
    for (; i + static_cast<std::size_t>(width) <= node.size(); i += static_cast<std::size_t>(width))
      on.back().emplace_back(node.begin() + static_cast<std::ptrdiff_t>(i), node.begin() + static_cast<std::ptrdiff_t>(i + width));
    left.insert(left.end(), node.begin() + static_cast<std::ptrdiff_t>(i), node.end());
  }
  std::sort(left.begin(), left.end());
  on.emplace_back();
  for (std::size_t i = 0; i + static_cast<std::size_t>(width) <= left.size(); i += static_cast<std::size_t>(width))
    on.back().emplace_back(left.begin() + static_cast<std::ptrdiff_t>(i), left.begin() + static_cast<std::ptrdiff_t>(i + width));
  std::size_t total = 0;
  for (const auto& g : on) total += g.size();
  std::vector<std::size_t> quota(on.size());
  std::vector<std::pair<double, std::size_t>> rest;  // (-fraction, node): the largest fractions first, then the earliest
  std::size_t given = 0;
  for (std::size_t k = 0; k < on.size(); ++k) {
    const double exact = total ? static_cast<double>(prefill_groups) * static_cast<double>(on[k].size()) / static_cast<double>(total) : 0;
    quota[k] = static_cast<std::size_t>(exact);
    given += quota[k];
    rest.push_back({-(exact - static_cast<double>(quota[k])), k});
  }
  std::sort(rest.begin(), rest.end());
  for (std::size_t i = 0; given < static_cast<std::size_t>(prefill_groups) && i < rest.size(); ++i)
    if (quota[rest[i].second] < on[rest[i].second].size()) ++quota[rest[i].second], ++given;
  std::vector<std::vector<int>> prefill, decode;
  for (std::size_t k = 0; k < on.size(); ++k)
    for (std::size_t i = 0; i < on[k].size(); ++i) (i < quota[k] ? prefill : decode).push_back(on[k][i]);
  return GroupMap(std::move(prefill), std::move(decode));
}

}  // namespace

GroupMap place_by_node(const std::vector<std::string>& hosts, int prefill_ranks, int prefill_tp, int decode_ranks,
                       int decode_tp, bool keep_roles) {
  const int a = std::max(1, prefill_tp), b = std::max(1, decode_tp);
  GroupMap in_order(prefill_ranks, a, decode_ranks, b);
  std::set<std::string> nodes;
  for (int r = 1; r <= prefill_ranks + decode_ranks; ++r)
    if (static_cast<std::size_t>(r) < hosts.size()) nodes.insert(hosts[static_cast<std::size_t>(r)]);
  if (nodes.size() < 2) return in_order;
  if (!keep_roles && prefill_ranks > 0 && a == b)
    return spread_roles(hosts, range(1, prefill_ranks + decode_ranks), a, prefill_ranks / a);
  const std::size_t split = in_order.spanning(hosts).size();
  if (split == 0 || (a == 1 && b == 1)) return in_order;
  const std::vector<int> prefill_widths(static_cast<std::size_t>(prefill_ranks / a), a);
  const std::vector<int> decode_widths(static_cast<std::size_t>(decode_ranks / b), b);
  std::vector<std::vector<int>> prefill, decode;
  if (keep_roles) {
    prefill = fill(hosts, range(1, prefill_ranks), prefill_widths);
    decode = fill(hosts, range(prefill_ranks + 1, prefill_ranks + decode_ranks), decode_widths);
  } else {
    std::vector<int> widths = prefill_widths;
    widths.insert(widths.end(), decode_widths.begin(), decode_widths.end());
    auto groups = fill(hosts, range(1, prefill_ranks + decode_ranks), widths);
    prefill.assign(groups.begin(), groups.begin() + static_cast<std::ptrdiff_t>(prefill_widths.size()));
    decode.assign(groups.begin() + static_cast<std::ptrdiff_t>(prefill_widths.size()), groups.end());
  }
  GroupMap placed(std::move(prefill), std::move(decode));
  return placed.spanning(hosts).size() < split ? placed : in_order;
}

}  // namespace tandem::topology
