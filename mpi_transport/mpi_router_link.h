// How rank 0's loop reaches the worker ranks under MPI: requests, cancels
// and roles out as messages of the protocol (tag = MsgType), results,
// streamed tokens, cache reports and counters in.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "mpi_transport/mpi_env.h"
#include "router/dispatcher.h"
#include "router/hosts.h"
#include "router/regroups.h"

namespace tandem::mpi {

// Rank 0's own counters: its CPU use over the job (user + system time / wall time).
service::RankReport router_report(std::chrono::steady_clock::time_point started, double cpu_at_start);
// This process's CPU time (user + system, every thread), in seconds.
double process_cpu_seconds();

// Rank 0 under MPI: requests and results are messages.
class MpiLink : public router::WorkerLink {
 public:
  // The job's workers as cells (topology::job_cells: one per worker, or
  // under job.mode = "auto" with two widths cells that regroup between
  // forms); every change of roles goes through them (router/regroups.h),
  // and set_roles() names prefill cells by their keys (Regroups::keys()).
  // block_bytes: a rank's KV block in each form.
  MpiLink(Mailbox& box, std::vector<topology::Cell> cells, topology::BySide<uint64_t> block_bytes);
  std::vector<int> workers() const override { return workers_; }
  std::vector<int> prefill_workers() const override { return prefill_; }
  bool set_roles(int64_t epoch, const std::vector<int>& prefill) override;
  const router::Regroups& regroups() const { return regroups_; }
  bool regroup(const std::function<bool(int)>& busy) override;
  bool regrouping() const override { return regroups_.in_flight(); }
  std::vector<int> take_emptied() override { return regroups_.take_emptied(); }
  void submit(int worker, const service::WireRequest& r) override { check(box_.send(worker, service::tag_of(service::MsgType::kRequest), service::encode(r))); }
  void cancel(int worker, uint64_t id) override { check(box_.send(worker, service::tag_of(service::MsgType::kCancel), service::encode_cancel(id))); }
  // Deltas before results: a request's last tokens reach rank 0 before its end.
  void poll(router::LinkEvents& events) override;
  // At the end, a worker that sends nothing for this long (they report every
  // half second while they run) is lost: shutdown() throws, naming it. 0: never.
  // While the job runs, poll() pings every worker a quarter of it apart, so a
  // worker cut off from rank 0 hears nothing and ends itself (WorkerService).
  void set_silence_limit(double seconds, std::vector<std::string> hosts) {
    silence_limit_s_ = seconds;
    hosts_ = std::move(hosts);
  }
  std::vector<service::RankReport> shutdown(bool abandon) override;

 private:
  // The workers that have not sent their final report, and where they ran.
  std::string silent_workers(const std::vector<service::RankReport>& reports) const {
    std::string who;
    for (const auto* side : {&workers_, &prefill_})
      for (int w : *side) {
        if (std::any_of(reports.begin(), reports.end(), [w](const auto& r) { return r.rank == w; })) continue;
        who += (who.empty() ? "" : ", ") + router::rank_on_host(w, hosts_);
      }
    return "worker rank(s) " + who + " sent nothing for " + std::to_string(static_cast<int>(silence_limit_s_)) +
           " s at the end of the job (job.worker_timeout_seconds): a node is down or unreachable, or a worker hangs; "
           "the output is committed: rerun with --resume to finish the input";
  }
  static void check(const Status& s) {
    if (!s.ok()) throw Error(s.to_string());
  }
  Mailbox& box_;
  std::vector<int> workers_, prefill_;
  Backoff backoff_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  double cpu_started_ = process_cpu_seconds();
  std::vector<service::RankReport> late_stats_;  // counters that arrived during shutdown
  double silence_limit_s_ = 0;
  std::chrono::steady_clock::time_point pinged_ = std::chrono::steady_clock::now();
  std::vector<std::string> hosts_;
  router::Regroups regroups_;
  void lists_from_regroups();
  // A regroup's messages (final reports, acknowledgements); true when any came.
  bool take_regroup_messages();
};

}  // namespace tandem::mpi
