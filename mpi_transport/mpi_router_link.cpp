#include "mpi_transport/mpi_router_link.h"

#include <sys/resource.h>

#include <algorithm>
#include <iterator>

namespace tandem::mpi {

double process_cpu_seconds() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// The router should need a small fraction of a core while the workers compute:
// its CPU time since `started` (start-up, tokenizer and config loading, is not
// routing) over the wall time since.
service::RankReport router_report(std::chrono::steady_clock::time_point started, double cpu_at_start) {
  service::RankReport r;
  r.rank = 0;
  r.role = service::Role::kRouter;
  const double cpu = process_cpu_seconds() - cpu_at_start;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  r.busy_fraction = wall > 0 ? cpu / wall : 0;
  return r;
}

MpiLink::MpiLink(Mailbox& box, std::vector<topology::Cell> cells, topology::BySide<uint64_t> block_bytes)
    : box_(box),
      regroups_(std::move(cells), block_bytes, [this](int rank, service::MsgType type, const std::vector<uint8_t>& bytes) {
        check(box_.send(rank, service::tag_of(type), bytes));
      }) {
  lists_from_regroups();
}

bool MpiLink::set_roles(int64_t epoch, const std::vector<int>& prefill) {
  regroups_.set_split(epoch, prefill);
  lists_from_regroups();
  return true;
}

void MpiLink::lists_from_regroups() {
  workers_ = regroups_.leaders(topology::Side::kDecode);
  prefill_ = regroups_.leaders(topology::Side::kPrefill);
}

bool MpiLink::regroup(const std::function<bool(int)>& busy) {
  if (!regroups_.in_flight()) return false;
  const bool changed = regroups_.step(busy);
  if (changed) lists_from_regroups();
  return changed;
}

bool MpiLink::take_regroup_messages() {
  bool any = false;
  for (auto type : {service::MsgType::kReport, service::MsgType::kGroupMapAck})
    for (;;) {
      std::optional<Message> m;
      check(box_.try_recv(m, MPI_ANY_SOURCE, service::tag_of(type)));
      if (!m) break;
      if (type == service::MsgType::kReport) regroups_.on_report(service::decode_report(m->bytes));
      else regroups_.on_ack(m->source, service::decode_id(m->bytes));
      any = true;
    }
  return any;
}

void MpiLink::poll(router::LinkEvents& events) {
  check(box_.progress());
  if (silence_limit_s_ > 0) {
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - pinged_).count() >= std::max(1.0, silence_limit_s_ / 4)) {
      for (const auto* side : {&workers_, &prefill_})
        for (int w : *side) check(box_.send(w, service::tag_of(service::MsgType::kPing), {}));
      pinged_ = now;
    }
  }
  bool any = regroups_.in_flight() && take_regroup_messages();
  for (int tag : {service::tag_of(service::MsgType::kCacheEvents), service::tag_of(service::MsgType::kStats),
                  service::tag_of(service::MsgType::kDeltas), service::tag_of(service::MsgType::kResult)}) {
    for (;;) {
      std::optional<Message> m;
      check(box_.try_recv(m, MPI_ANY_SOURCE, tag));
      if (!m) break;
      switch (tag) {
        case service::tag_of(service::MsgType::kResult): events.results.push_back(service::decode_result(m->bytes)); break;
        case service::tag_of(service::MsgType::kCacheEvents): events.cache_events.push_back(service::decode_cache_events(m->bytes)); break;
        case service::tag_of(service::MsgType::kStats):
          events.stats.push_back(service::decode_report(m->bytes));
          regroups_.on_stats(events.stats.back());
          break;
        default: {
          auto d = service::decode_deltas(m->bytes);
          events.deltas.insert(events.deltas.end(), std::make_move_iterator(d.deltas.begin()),
                               std::make_move_iterator(d.deltas.end()));
        }
      }
      any = true;
    }
  }
  if (any) backoff_.reset();
  else backoff_.idle();
}

std::vector<service::RankReport> MpiLink::shutdown(bool abandon) {
  router::LinkEvents ignored;
  regroups_.finish([&] {
    ignored.clear();
    poll(ignored);
    lists_from_regroups();
  }, silence_limit_s_);
  lists_from_regroups();
  const std::vector<uint8_t> how{static_cast<uint8_t>(abandon ? 1 : 0)};
  for (int w : workers_) check(box_.send(w, service::tag_of(service::MsgType::kShutdown), how));
  for (int w : prefill_) check(box_.send(w, service::tag_of(service::MsgType::kShutdown), how));
  std::vector<service::RankReport> reports{router_report(started_, cpu_started_)};
  // Every tag, in each worker's send order: the counters, deltas and cache
  // reports still on their way must be received too, or a worker whose
  // larger messages wait for a matching receive would never finish sending.
  auto heard = std::chrono::steady_clock::now();
  while (reports.size() < workers_.size() + prefill_.size() + 1) {
    std::optional<Message> m;
    check(box_.try_recv(m, MPI_ANY_SOURCE, MPI_ANY_TAG));
    if (!m) {
      if (silence_limit_s_ > 0 &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - heard).count() > silence_limit_s_)
        throw Error(silent_workers(reports));
      backoff_.idle();
      continue;
    }
    heard = std::chrono::steady_clock::now();
    if (m->tag == service::tag_of(service::MsgType::kReport)) reports.push_back(service::decode_report(m->bytes));
    else if (m->tag == service::tag_of(service::MsgType::kStats)) late_stats_.push_back(service::decode_report(m->bytes));
  }
  for (const auto& late : late_stats_)  // their measured steps still count
    for (auto& r : reports)
      if (r.rank == late.rank) r.step_samples.insert(r.step_samples.end(), late.step_samples.begin(), late.step_samples.end());
  for (auto& r : regroups_.take_retired()) reports.push_back(std::move(r));  // the workers that regrouped away
  check(box_.flush());
  return reports;
}

}  // namespace tandem::mpi
