#include "router/regroups.h"

#include <algorithm>
#include <string>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "topology/group_map.h"

namespace tandem::router {

using topology::Side;

Regroups::Regroups(std::vector<topology::Cell> cells, topology::BySide<uint64_t> block_bytes, Send send)
    : block_bytes_(block_bytes), send_(std::move(send)) {
  for (auto& c : cells) cells_.push_back({std::move(c), State::kActive, {}, {}, {}, {}});
}

std::vector<int> Regroups::keys() const {
  std::vector<int> out;
  for (const Entry& e : cells_) out.push_back(e.cell.key());
  return out;
}

std::vector<int> Regroups::leaders(Side side) const {
  std::vector<int> out;
  for (const Entry& e : cells_)
    if (e.state == State::kActive && e.cell.form == side)
      for (const auto& g : e.cell.groups(side)) out.push_back(g.front());
  if (side == Side::kPrefill && !split_order_.empty()) {  // as the planner named them (its order spreads the nodes)
    auto at = [this](int leader) {
      return std::find(split_order_.begin(), split_order_.end(), leader) - split_order_.begin();
    };
    std::stable_sort(out.begin(), out.end(), [&](int a, int b) { return at(a) < at(b); });
  }
  return out;
}

std::vector<int> Regroups::prefill_leaders() const {
  std::vector<int> out;
  for (const Entry& e : cells_)
    if (e.cell.target == Side::kPrefill)
      for (const auto& g : e.cell.groups(Side::kPrefill)) out.push_back(g.front());
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
  split_order_ = prefill;
  bool changed = false;
  for (Entry& e : cells_) {
    const Side want = std::find(prefill.begin(), prefill.end(), e.cell.key()) != prefill.end() ? Side::kPrefill
                                                                                              : Side::kDecode;
    if (want == e.cell.target) continue;
    changed = true;
    e.cell.target = want;
    if (e.cell.one_form()) {  // a worker changes side where it stands: its role is all it hears
      e.cell.form = want;
      continue;
    }
    e.state = State::kRetiring;
    e.retired = Clock::now();
  }
  // The cells that keep their form keep their workers; their roles may still change (agg <-> disagg).
  const auto roles = service::encode(service::WireRoles{epoch, prefill_leaders()});
  for (const Entry& e : cells_)
    if (e.state == State::kActive)
      for (const auto& g : e.cell.groups(e.cell.form)) send_(g.front(), service::MsgType::kRoles, roles);
  return changed;
}

void Regroups::on_stats(const service::RankReport& r) {
  for (Entry& e : cells_)
    for (const auto& g : e.cell.groups(e.cell.target)) {
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
      for (const auto& g : e.cell.groups(e.cell.form))
        if (!blocks_.contains(g.front())) return false;
  return true;
}

void Regroups::send_map() {
  service::WireGroupMap m;
  m.serial = ++serial_;
  std::vector<int> to;
  for (Entry& e : cells_) {
    if (e.state == State::kRetiring) {  // its old workers still move KV for what was placed there: on the map, as they are
      const Side s = e.cell.form;
      for (const auto& g : e.cell.groups(s)) m.groups.push_back({s == Side::kPrefill, g, block_bytes_[s], blocks_[g.front()]});
      continue;
    }
    const bool ready = e.state == State::kDraining && e.reports_due.empty() && e.loads_due.empty();
    if (e.state != State::kActive && !ready) continue;  // a cell draining moves no KV with the others
    if (ready) e.state = State::kMapping;
    const Side s = e.cell.target;
    for (const auto& g : e.cell.groups(s)) {
      m.groups.push_back({s == Side::kPrefill, g, block_bytes_[s], blocks_[g.front()]});
      to.push_back(g.front());
    }
  }
  const auto bytes = service::encode(m);
  for (int leader : to) send_(leader, service::MsgType::kGroupMap, bytes);
  acks_due_ = {to.begin(), to.end()};
}

namespace {

// "prefill", "decode", or "aggregated" where no worker prefills.
const char* form_name(Side s, bool disaggregated) {
  return s == Side::kPrefill ? "prefill" : disaggregated ? "decode" : "aggregated";
}

}  // namespace

bool Regroups::step(const std::function<bool(int)>& busy) {
  bool changed = false;
  const auto roles = service::encode(service::WireRoles{epoch_, prefill_leaders()});
  for (Entry& e : cells_) {
    if (e.state != State::kRetiring) continue;
    const auto& old = e.cell.groups(e.cell.form);
    if (std::any_of(old.begin(), old.end(), [&](const auto& g) { return busy(g.front()); })) continue;
    std::vector<int> all;
    for (const auto& g : old) {
      send_(g.front(), service::MsgType::kRegroup, roles);
      e.reports_due.insert(g.front());
      all.insert(all.end(), g.begin(), g.end());
    }
    for (const auto& g : e.cell.groups(e.cell.target)) e.loads_due.insert(g.front());
    e.state = State::kDraining;
    e.told = Clock::now();
    spdlog::info("epoch {}: ranks {} regroup into {} worker(s) of {} rank(s)", epoch_, topology::GroupMap::describe(all),
                 form_name(e.cell.target, !prefill_leaders().empty()), e.cell.groups(e.cell.target).front().size());
  }
  const bool mapping = std::any_of(cells_.begin(), cells_.end(), [](const Entry& e) { return e.state == State::kMapping; });
  if (mapping && acks_due_.empty()) {
    const auto now = Clock::now();
    auto s = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    for (Entry& e : cells_) {
      if (e.state != State::kMapping) continue;
      e.state = State::kActive;
      e.cell.form = e.cell.target;
      const auto& g = e.cell.groups(e.cell.form);
      for (const auto& ranks : g) emptied_.insert(emptied_.end(), ranks.begin(), ranks.end());
      spdlog::info("epoch {}: ranks {}-{} back as {} {} worker(s) of {} rank(s), {:.2f} s after the split: {:.2f} s until "
                   "nothing placed there was out, {:.2f} s to drain, regroup and be known to every worker",
                   epoch_, g.front().front(), g.back().back(), g.size(), form_name(e.cell.form, !prefill_leaders().empty()),
                   g.front().size(), s(e.retired, now), s(e.retired, e.told), s(e.told, now));
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
      e.cell.target = e.cell.form;
      e.state = State::kActive;
    }
}

void Regroups::finish(const std::function<void()>& pump, double silence_s) {
  cancel_retiring();  // cells on their way come back first (nothing is placed on them: they finish at once)
  auto heard = Clock::now();
  for (int64_t seen = progress_; in_flight();) {
    pump();
    step([](int) { return false; });
    if (progress_ != seen) {  // the regrouping workers' own steps, not the others' counters
      seen = progress_;
      heard = Clock::now();
    }
    if (silence_s > 0 && std::chrono::duration<double>(Clock::now() - heard).count() > silence_s)
      throw Error("the workers regrouping at the end of the job sent nothing for " +
                  std::to_string(static_cast<int>(silence_s)) +
                  " s (job.worker_timeout_seconds): a node is down or a worker hangs; the output is committed: "
                  "rerun with --resume to finish the input");
  }
}

}  // namespace tandem::router
