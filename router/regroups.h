// Re-splits that change a worker's width: rank 0's side.
//
// With prefill_tp != decode_tp under job.mode = "auto", the workers are
// cells of lcm(prefill_tp, decode_tp) ranks (planner/simulator.h, Cell):
// a cell runs prefill workers of prefill_tp ranks, or decode (aggregated:
// agg) workers of decode_tp ranks. The planner's split counts cells; a
// cell whose form changes regroups, and only its ranks stop work:
//  1. retiring: rank 0 places nothing more on its workers; once none holds a
//     request (as its decode worker or its prefill worker), each leader is
//     told to regroup (kRegroup, with the new roles);
//  2. draining: each old leader finishes what it holds and reports
//     (kReport); the cell's ranks then load the new form's shards and the
//     new leaders report in (kStats at their new width, with their KV blocks);
//  3. mapping: every worker that moves KV, the new ones included, is told
//     the workers' map and pools (kGroupMap) and answers (kGroupMapAck);
//  4. active: rank 0 places on the new workers.
// A split asked for while a cell is on its way waits until none is. A cell
// of one form (one width: a cell is a worker) changes side at once and only
// hears its role. The cells are topology::Cell (topology/cells.h). No MPI
// here: messages go out through `send`, and the link feeds back what arrives.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "runtime/service/protocol.h"
#include "topology/cells.h"

namespace tandem::router {

class Regroups {
 public:
  using Send = std::function<void(int rank, service::MsgType type, const std::vector<uint8_t>& bytes)>;
  using Side = topology::Side;
  // block_bytes: a rank's KV block in a prefill worker and in a decode worker.
  Regroups(std::vector<topology::Cell> cells, topology::BySide<uint64_t> block_bytes, Send send);

  // The cells' keys (lowest ranks) in rank order: a split names its prefill cells by them.
  std::vector<int> keys() const;
  // The leaders rank 0 may place on now (prefill's in the order the last split named them).
  std::vector<int> leaders(Side side) const;
  // A re-split: the cells keyed in `prefill` prefill from now on, the rest
  // decode. Cells that change start retiring; the others hear their roles
  // (kRoles). While any cell is on its way it is kept for later. True when
  // the leaders rank 0 may place on changed.
  bool set_split(int64_t epoch, const std::vector<int>& prefill);
  // What came from the workers: counters (kStats), a final report (kReport) and an acknowledgement.
  void on_stats(const service::RankReport& r);
  void on_report(service::RankReport r);
  void on_ack(int rank, int64_t serial);
  // Moves every cell on its way along; busy(rank): a request placed there
  // has not come back. True when the leaders rank 0 may place on changed.
  bool step(const std::function<bool(int)>& busy);
  // A cell is on its way (the job cannot end before it is back).
  bool in_flight() const;
  // Counts every step a cell on its way took (a report, a load, an answer): a watchdog's measure.
  int64_t progress() const { return progress_; }
  // At the end: cells still retiring stay as they were (they were never told).
  void cancel_retiring();
  // At the end: cancel_retiring(), then every cell on its way is brought
  // back, `pump` feeding back what arrives. Throws tandem::Error when they
  // take no step for `silence_s` (job.worker_timeout_seconds; 0: never).
  void finish(const std::function<void()>& pump, double silence_s);
  // The ranks of cells back since the last call: their pools started empty (rank 0 forgets what they held).
  std::vector<int> take_emptied() { return std::move(emptied_); }
  // The reports of the workers that regrouped away, for the job's summary.
  std::vector<service::RankReport> take_retired() { return std::move(retired_); }

 private:
  enum class State { kActive, kRetiring, kDraining, kMapping };
  using Clock = std::chrono::steady_clock;
  struct Entry {
    topology::Cell cell;
    State state = State::kActive;
    std::set<int> reports_due, loads_due;
    Clock::time_point retired, told;  // placed on no more; told to regroup (for the log)
  };
  std::vector<int> prefill_leaders() const;  // every cell's, in its form to be
  bool blocks_known() const;
  void send_map();

  std::vector<Entry> cells_;
  topology::BySide<uint64_t> block_bytes_;
  Send send_;
  std::map<int, int64_t> blocks_;  // each leader's KV blocks, as it reported them
  int64_t serial_ = 0, progress_ = 0;
  std::set<int> acks_due_;
  int64_t epoch_ = 0;
  std::optional<std::pair<int64_t, std::vector<int>>> pending_;
  std::vector<int> split_order_;  // the last split's prefill keys, as named
  std::vector<service::RankReport> retired_;
  std::vector<int> emptied_;
};

}  // namespace tandem::router
