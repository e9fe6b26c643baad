// The regroup protocol end to end without mpirun: rank 0's side
// (router::Regroups) and every worker rank's side (the worker service, a
// tensor-parallel group's leader and follower, and topology::regroup for
// where a rank stands next) in one process, a thread per rank, joined by an
// in-process port (messages in queues, KV copied between the ranks' pools,
// slices of blocks where the widths differ). A job of two cells of 2 ranks
// (prefill workers of 2 ranks, decode workers of 1) goes aggregated, then
// disaggregated the other way round; the tokens are the same bits in both.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include "router/regroups.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/cpu/tp_group.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/service/group_worker.h"
#include "runtime/service/worker_service.h"
#include "test_model.h"
#include "thread_group.h"
#include "wire_workload.h"
#include "topology/place.h"

using namespace tandem;
using namespace tandem::service;
using topology::Side;

namespace {

// What the ranks share: each rank's inbox and KV arrivals, its pool as it stands, its groups' exchanges.
struct Hub {
  std::mutex mu;
  std::map<int, std::deque<WorkerPort::Message>> inbox;
  std::map<int, std::deque<WorkerPort::KvArrival>> kv_inbox;
  std::map<int, kv::BlockPool*> pools;
  std::map<std::pair<int, int>, std::unique_ptr<testing::ThreadGroup>> groups;  // by (leader, incarnation)
  int64_t kv_bytes = 0;

  void send(int from, int to, MsgType type, std::vector<uint8_t> bytes) {
    std::lock_guard lock(mu);
    inbox[to].push_back({from, type, std::move(bytes)});
  }
  std::deque<WorkerPort::Message> take(int rank) {
    std::lock_guard lock(mu);
    return std::exchange(inbox[rank], {});
  }
  testing::ThreadGroup& group(int leader, int incarnation, int width) {
    std::lock_guard lock(mu);
    auto& g = groups[{leader, incarnation}];
    if (!g) g = std::make_unique<testing::ThreadGroup>(width);
    return *g;
  }
  void set_pool(int rank, kv::BlockPool* pool) {
    std::lock_guard lock(mu);
    pools[rank] = pool;
  }
};

// A rank's port: KV lands in the peer's pool at once (whole blocks, or each
// row's slice), its note with it.
class HubPort : public WorkerPort {
 public:
  HubPort(Hub& hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  bool receive(Message& out) override {
    std::lock_guard lock(hub_.mu);
    auto& q = hub_.inbox[rank_];
    if (q.empty()) return false;
    out = std::move(q.front());
    q.pop_front();
    return true;
  }
  void send(int dest, MsgType type, std::vector<uint8_t> bytes) override { hub_.send(rank_, dest, type, std::move(bytes)); }
  bool has_kv() const override { return true; }
  int64_t post_kv(int dest, std::span<const int32_t> src, std::span<const int32_t> dst, std::span<const uint8_t> note,
                  const KvSlice* slice) override {
    std::lock_guard lock(hub_.mu);
    const kv::BlockPool& me = *hub_.pools.at(rank_);
    kv::BlockPool& them = *hub_.pools.at(dest);
    const std::size_t sb = me.layout().block_bytes(), db = them.layout().block_bytes();
    if (src.size() != dst.size() || (!slice && sb != db)) throw std::logic_error("a transfer that does not match");
    for (std::size_t i = 0; i < src.size(); ++i) {
      const auto* s = reinterpret_cast<const uint8_t*>(me.data()) + static_cast<std::size_t>(src[i]) * sb;
      auto* d = reinterpret_cast<uint8_t*>(them.data()) + static_cast<std::size_t>(dst[i]) * db;
      if (!slice) {
        std::memcpy(d, s, sb);
        hub_.kv_bytes += static_cast<int64_t>(sb);
        continue;
      }
      const std::size_t sr = sb / static_cast<std::size_t>(slice->rows), dr = db / static_cast<std::size_t>(slice->rows);
      for (int64_t row = 0; row < slice->rows; ++row)
        std::memcpy(d + static_cast<std::size_t>(row) * dr + slice->dst_offset,
                    s + static_cast<std::size_t>(row) * sr + slice->src_offset, slice->bytes);
      hub_.kv_bytes += slice->rows * static_cast<int64_t>(slice->bytes);
    }
    hub_.kv_inbox[dest].push_back({rank_, false, std::vector<uint8_t>(note.begin(), note.end())});
    return next_++;
  }
  KvState poll_kv(int64_t) override { return KvState::kDone; }
  void release_kv(int64_t) override {}
  void kv_arrivals(std::vector<KvArrival>& out) override {
    std::lock_guard lock(hub_.mu);
    auto& q = hub_.kv_inbox[rank_];
    std::move(q.begin(), q.end(), std::back_inserter(out));
    q.clear();
  }
  void flush() override {}

 private:
  Hub& hub_;
  int rank_;
  int64_t next_ = 1;
};

// One worker rank, as launcher/run/worker_rank.cpp runs it: a worker (leader
// or follower) until rank 0 says stop, and where its cell regroups, the next
// one at the place topology::regroup gives. Its last place.
topology::Place run_rank(Hub& hub, const testing::TinyModel& tiny, const runtime::ModelWeights& weights,
                         topology::Place place) {
  const int rank = place.rank;
  for (;;) {
    const int width = place.group.width;
    const auto local = width > 1 ? runtime::cpu::shard_config(tiny.config, {place.group.place, width}) : tiny.config;
    kv::BlockPool pool(kv::KvLayout{tiny.config.layers, local.kv_heads, tiny.config.head_dim, 16}, 64);
    hub.set_pool(rank, &pool);
    runtime::cpu::ThreadPool threads(1);
    HubPort port(hub, rank);
    const topology::GroupMap& map = place.roles.map();
    std::optional<testing::ThreadGroup::Member> member;
    if (width > 1) member.emplace(hub.group(map.leader_of(rank), place.incarnation, width), place.group.place);
    auto model = runtime::make_backend("cpu", tiny.config, weights, pool, threads, member ? &*member : nullptr);
    const KvShape shape{tiny.config.kv_heads, pool.layout().head_rows(), pool.layout().head_run_bytes()};
    std::optional<GroupBlocks> blocks;
    if (member) blocks.emplace(*member, pool, shape);
    auto idle = [] { std::this_thread::sleep_for(std::chrono::microseconds(100)); };
    std::vector<uint8_t> note;
    if (place.group.place > 0) {
      Follower follower(port, *model, place.group.place, width, map, shape, *blocks);
      while (!follower.finished())
        if (!follower.tick()) idle();
      note = follower.stop_note();
    } else {
      std::vector<int> followers = map.members(rank);
      followers.erase(followers.begin());
      LeaderPort group_port(port, followers, map, shape);  // a job with groups: every leader routes through one
      std::unique_ptr<runtime::ModelBackend> backend =
          width > 1 ? std::make_unique<LeaderBackend>(std::move(model), group_port) : std::move(model);
      WorkerCore core(rank, role_for(place.disaggregated, place.side()), tiny.config,
                      std::move(backend), pool, nullptr, runtime::EngineOptions{16, 256, 0});
      core.set_group_width(width);
      WorkerService service(core, group_port, [](Role) {});
      while (!service.finished())
        if (!service.tick()) idle();
      group_port.set_stop_note(service.regroup_note());  // the followers regroup too
      service.finish();
      note = service.regroup_note();
    }
    hub.set_pool(rank, nullptr);
    if (note.empty()) return place;
    place = topology::regroup(place, decode_roles(note).prefill_ranks);
  }
}

// Rank 0: the regroups, what it placed and what came back.
struct Rank0 {
  Rank0(Hub& h, router::Regroups r) : hub(h), regroups(std::move(r)) {}
  Hub& hub;
  router::Regroups regroups;
  std::map<uint64_t, std::pair<int, int>> out;  // request id -> (its worker, its prefill worker)
  std::map<uint64_t, WireResult> results;
  std::vector<RankReport> reports;  // final reports outside a regroup (the end)
  bool ending = false;

  bool busy(int leader) const {
    for (const auto& [id, at] : out)
      if (at.first == leader || at.second == leader) return true;
    return false;
  }
  void pump() {
    for (auto& m : hub.take(0)) {
      switch (m.type) {
        case MsgType::kStats: regroups.on_stats(decode_report(m.bytes)); break;
        case MsgType::kReport:
          if (ending) reports.push_back(decode_report(m.bytes));
          else regroups.on_report(decode_report(m.bytes));
          break;
        case MsgType::kGroupMapAck: regroups.on_ack(m.source, decode_id(m.bytes)); break;
        case MsgType::kResult: {
          auto r = decode_result(m.bytes);
          out.erase(r.id);
          results[r.id] = std::move(r);
          break;
        }
        default: break;  // deltas, cache reports
      }
    }
  }
  // Pumps and moves the regroups along until `done`; false after 60 s.
  template <class Done>
  bool until(Done&& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      pump();
      if (regroups.in_flight()) regroups.step([this](int r) { return busy(r); });
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  }
  // Every request to a decode leader in turn (from the `first`), prefilled (disaggregated) on `prefill` when it is set.
  std::map<uint64_t, WireResult> run(const std::vector<WireRequest>& reqs, int prefill, std::size_t first = 0) {
    results.clear();
    const auto decode = regroups.leaders(Side::kDecode);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      WireRequest r = reqs[i];
      const int worker = decode[(i + first) % decode.size()];
      r.prefill_rank = prefill;
      out[r.id] = {worker, prefill};
      hub.send(0, worker, MsgType::kRequest, encode(r));
    }
    REQUIRE(until([&] { return results.size() == reqs.size(); }));
    return results;
  }
};

}  // namespace

TEST_CASE("a regroup end to end: cells change form and width, their ranks rebuild as topology says, tokens stay the same bits",
          "[service][tp]") {
  testing::TinyModel tiny;
  const auto weights = runtime::ModelWeights::load(tiny.config, tiny.dir, /*panels=*/false);  // as a cell's ranks load them
  const topology::Ask ask{topology::Mode::kAuto, {2, 1}, {0, 0}, 0.5};
  const topology::Roles roles = topology::plan_roles(ask, 5);
  const int cell = topology::cell_ranks(ask, roles, 5);
  REQUIRE(cell == 2);  // {1,2} prefills as one worker of 2 ranks; {3,4} decodes as two of 1
  auto bytes_at = [&](int width) {
    return static_cast<uint64_t>(kv::KvLayout{tiny.config.layers, tiny.config.kv_heads / width, tiny.config.head_dim, 16}.block_bytes());
  };
  Hub hub;
  Rank0 rank0(hub, router::Regroups(topology::job_cells(roles, cell), {bytes_at(2), bytes_at(1)},
                                    [&hub](int to, MsgType type, const std::vector<uint8_t>& b) { hub.send(0, to, type, b); }));
  std::map<int, topology::Place> last;
  std::map<int, std::exception_ptr> failed;
  std::vector<std::thread> ranks;
  std::mutex done_mu;
  for (int r = 1; r <= 4; ++r)
    ranks.emplace_back([&, r] {
      try {
        auto place = run_rank(hub, tiny, *weights, topology::place_of(r, roles, true, true, cell));
        std::lock_guard lock(done_mu);
        last[r] = place;
      } catch (...) {
        std::lock_guard lock(done_mu);
        failed[r] = std::current_exception();
      }
    });
  struct Join {  // a hang fails the test (ctest's timeout) rather than leaving threads behind
    std::vector<std::thread>& t;
    ~Join() {
      for (auto& x : t)
        if (x.joinable()) x.join();
    }
  } join{ranks};

  const auto reqs = testing::wire_workload(10);
  // Aggregated: cell {1,2} regroups into two workers of one rank; {3,4} only hears its role.
  rank0.regroups.set_split(1, {});
  REQUIRE(rank0.until([&] { return !rank0.regroups.in_flight(); }));
  CHECK(rank0.regroups.leaders(Side::kDecode) == std::vector<int>{1, 2, 3, 4});
  CHECK(rank0.regroups.leaders(Side::kPrefill).empty());
  const auto agg = rank0.run(reqs, -1);
  for (const auto& r : reqs) {
    REQUIRE(agg.at(r.id).ok);
    CHECK(agg.at(r.id).tokens.size() == static_cast<std::size_t>(r.params.max_tokens));
  }
  CHECK(hub.kv_bytes == 0);

  // Disaggregated the other way round: {3,4} prefills as one worker of 2 ranks, 1 and 2 decode.
  rank0.regroups.set_split(2, {3});
  REQUIRE(rank0.until([&] { return !rank0.regroups.in_flight(); }));
  CHECK(rank0.regroups.leaders(Side::kPrefill) == std::vector<int>{3});
  CHECK(rank0.regroups.leaders(Side::kDecode) == std::vector<int>{1, 2});
  const auto dis = rank0.run(reqs, 3, 1);  // no request on the worker that ran it before: its prefix cache would hold it
  for (const auto& r : reqs) {
    INFO("request " << r.id);
    REQUIRE(dis.at(r.id).ok);
    CHECK(dis.at(r.id).tokens == agg.at(r.id).tokens);  // the same bits from a width-2 prefill's KV, sliced across
    CHECK(dis.at(r.id).kv_blocks_moved > 0);
  }
  CHECK(hub.kv_bytes > 0);

  // The end: every leader stops and reports; every rank's thread ends where topology put it.
  rank0.regroups.finish([&] { rank0.pump(); }, 30);
  rank0.ending = true;
  for (int leader : {1, 2, 3}) hub.send(0, leader, MsgType::kShutdown, {0});
  REQUIRE(rank0.until([&] { return rank0.reports.size() == 3; }));
  for (auto& t : ranks) t.join();
  for (const auto& [r, e] : failed) {
    INFO("rank " << r);
    CHECK_NOTHROW(std::rethrow_exception(e));
  }
  REQUIRE(last.size() == 4);
  for (const auto& rep : rank0.reports) CHECK(rep.kv_blocks_used == 0);
  const auto retired = rank0.regroups.take_retired();  // the worker of {1,2}, then those of 3 and of 4
  CHECK(retired.size() == 3);
  CHECK(last[1].side() == Side::kDecode);
  CHECK(last[1].group.width == 1);
  CHECK(last[1].incarnation == 1);
  CHECK(last[3].side() == Side::kPrefill);
  CHECK(last[3].group.width == 2);
  CHECK(last[4].group.place == 1);
  CHECK(last[4].roles.map().members(4) == std::vector<int>{3, 4});  // its own worker, as topology gave it
  CHECK(last[2].roles.map().members(2) == std::vector<int>{2});
}
