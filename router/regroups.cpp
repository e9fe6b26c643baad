#include "router/regroups.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "runtime/service/group_map.h"

namespace tandem::router {

Regroups::Regroups(std::vector<RegroupCell> cells, uint64_t prefill_block_bytes, uint64_t decode_block_bytes, Send send)
    : block_bytes_{prefill_block_bytes, decode_block_bytes}, send_(std::move(send)) {
  for (auto& c : cells) cells_.push_back({std::move(c), State::kActive, {}, {}, {}, {}});
}

std::vector<int> Regroups::keys() const {
  std::vector<int> out;
  for (const Entry& e : cells_) out.push_back(e.cell.key());
  return out;
}

std::vector<int> Regroups::leaders(bool prefill) const {
  std::vector<int> out;
  for (const Entry& e : cells_)
    if (e.state == State::kActive && e.cell.prefill == prefill)
      for (const auto& g : groups(e, prefill)) out.push_back(g.front());
  return out;
}

std::vector<int> Regroups::prefill_leaders() const {
  std::vector<int> out;
  for (const Entry& e : cells_)
    if (e.cell.prefill)
      for (const auto& g : e.cell.prefill_groups) out.push_back(g.front());
  return out;
}

bool Regroups::in_flight() const {
  return std::any_of(cells_.begin(), cells_.end(), [](const Entry& e) { return e.state != State::kActive; });
}

bool Regroups::set_split(int64_t epoch, const std::vector<int>& prefill) {
  if (in_flight()) {
    pending_ = {epoch, prefill};  // the last word counts, once every cell is back
    return false;
  }
  epoch_ = epoch;
  bool changed = false;
  for (Entry& e : cells_) {
    const bool want = std::find(prefill.begin(), prefill.end(), e.cell.key()) != prefill.end();
    if (want == e.cell.prefill) continue;
    e.cell.prefill = want;
    e.state = State::kRetiring;
    e.retired = Clock::now();
    changed = true;
  }
  // The cells that keep their form keep their workers; their roles may still change (agg <-> disagg).
  const auto roles = service::encode(service::WireRoles{epoch, prefill_leaders()});
  for (const Entry& e : cells_)
    if (e.state == State::kActive)
      for (const auto& g : groups(e, e.cell.prefill)) send_(g.front(), service::MsgType::kRoles, roles);
  return changed;
}

void Regroups::on_stats(const service::RankReport& r) {
  for (Entry& e : cells_)
    for (const auto& g : groups(e, e.cell.prefill)) {
      if (g.front() != r.rank || static_cast<int>(g.size()) != r.tp) continue;  // an old form's counters: not loaded yet
      if (e.state == State::kActive) blocks_[r.rank] = r.kv_blocks_total;
      if (e.state == State::kDraining && e.loads_due.erase(r.rank) > 0) {
        blocks_[r.rank] = r.kv_blocks_total;
        ++progress_;
      }
    }
}

void Regroups::on_report(service::RankReport r) {
  for (Entry& e : cells_)
    if (e.state == State::kDraining && e.reports_due.erase(r.rank) > 0) {
      ++progress_;
      retired_.push_back(std::move(r));
      return;
    }
  spdlog::warn("a final report from rank {} in the middle of the job, from no regrouping worker; ignored", r.rank);
}

void Regroups::on_ack(int rank, int64_t serial) {
  if (serial == serial_ && acks_due_.erase(rank) > 0) ++progress_;
}

// Every worker that will be on the map has said how many KV blocks it has (its first counters, at load).
bool Regroups::blocks_known() const {
  for (const Entry& e : cells_)
    if (e.state == State::kActive || e.state == State::kRetiring)
      for (const auto& g : groups(e, e.state == State::kActive ? e.cell.prefill : !e.cell.prefill))
        if (!blocks_.contains(g.front())) return false;
  return true;
}

void Regroups::send_map() {
  service::WireGroupMap m;
  m.serial = ++serial_;
  std::vector<int> to;
  for (Entry& e : cells_) {
    if (e.state == State::kRetiring) {  // its old workers still move KV for what was placed there: on the map, as they are
      for (const auto& g : groups(e, !e.cell.prefill))
        m.groups.push_back({!e.cell.prefill, g, block_bytes_[e.cell.prefill ? 1 : 0], blocks_[g.front()]});
      continue;
    }
    const bool ready = e.state == State::kDraining && e.reports_due.empty() && e.loads_due.empty();
    if (e.state != State::kActive && !ready) continue;  // a cell draining moves no KV with the others
    if (ready) e.state = State::kMapping;
    for (const auto& g : groups(e, e.cell.prefill)) {
      m.groups.push_back({e.cell.prefill, g, block_bytes_[e.cell.prefill ? 0 : 1], blocks_[g.front()]});
      to.push_back(g.front());
    }
  }
  const auto bytes = service::encode(m);
  for (int leader : to) send_(leader, service::MsgType::kGroupMap, bytes);
  acks_due_ = {to.begin(), to.end()};
}

bool Regroups::step(const std::function<bool(int)>& busy) {
  bool changed = false;
  const auto roles = service::encode(service::WireRoles{epoch_, prefill_leaders()});
  for (Entry& e : cells_) {
    if (e.state != State::kRetiring) continue;
    const auto& old = groups(e, !e.cell.prefill);
    if (std::any_of(old.begin(), old.end(), [&](const auto& g) { return busy(g.front()); })) continue;
    for (const auto& g : old) {
      send_(g.front(), service::MsgType::kRegroup, roles);
      e.reports_due.insert(g.front());
    }
    for (const auto& g : groups(e, e.cell.prefill)) e.loads_due.insert(g.front());
    e.state = State::kDraining;
    e.told = Clock::now();
    spdlog::info("epoch {}: ranks {} regroup into {} worker(s) of {} rank(s)", epoch_,
                 service::GroupMap::describe([&] {
                   std::vector<int> all;
                   for (const auto& g : old) all.insert(all.end(), g.begin(), g.end());
                   return all;
                 }()),
                 e.cell.prefill ? "prefill" : prefill_leaders().empty() ? "aggregated" : "decode",
                 groups(e, e.cell.prefill).front().size());
  }
  const bool mapping = std::any_of(cells_.begin(), cells_.end(), [](const Entry& e) { return e.state == State::kMapping; });
  if (mapping && acks_due_.empty()) {
    const auto now = Clock::now();
    auto s = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    for (Entry& e : cells_) {
      if (e.state != State::kMapping) continue;
      e.state = State::kActive;
      const auto& g = groups(e, e.cell.prefill);
      for (const auto& ranks : g) emptied_.insert(emptied_.end(), ranks.begin(), ranks.end());
      spdlog::info("epoch {}: ranks {}-{} back as {} {} worker(s) of {} rank(s), {:.2f} s after the split: {:.2f} s until "
                   "nothing placed there was out, {:.2f} s to drain, regroup and be known to every worker",
                   epoch_, g.front().front(), g.back().back(), g.size(),
                   e.cell.prefill ? "prefill" : prefill_leaders().empty() ? "aggregated" : "decode", g.front().size(),
                   s(e.retired, now), s(e.retired, e.told), s(e.told, now));
    }
    changed = true;
  } else if (!mapping && blocks_known() && std::any_of(cells_.begin(), cells_.end(), [](const Entry& e) {
               return e.state == State::kDraining && e.reports_due.empty() && e.loads_due.empty();
             })) {
    send_map();
  }
  if (!in_flight() && pending_) {
    auto [epoch, prefill] = std::move(*pending_);
    pending_.reset();
    changed = set_split(epoch, prefill) || changed;
  }
  return changed;
}

void Regroups::cancel_retiring() {
  pending_.reset();
  for (Entry& e : cells_)
    if (e.state == State::kRetiring) {
      e.cell.prefill = !e.cell.prefill;
      e.state = State::kActive;
    }
}

}  // namespace tandem::router
