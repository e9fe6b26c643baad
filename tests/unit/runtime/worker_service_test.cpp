// The worker service without mpirun: workers in one process, joined by an
// in-process port (messages in queues, KV by memcpy between their pools,
// notifications at the sender's next poll as on a real transport), the test
// playing rank 0. Disaggregated outputs must equal the aggregated ones
// bitwise; cancels, refusals, re-splits and shutdown leave no block behind.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <optional>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "runtime/cpu/thread_pool.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/service/group_worker.h"
#include "runtime/service/worker_service.h"
#include "test_model.h"
#include "thread_group.h"
#include "wire_workload.h"

using namespace tandem;
using namespace tandem::service;

namespace {

// The job: rank 0 (the test) and workers 1..n, with their pools.
struct FakeJob {
  std::map<int, std::deque<WorkerPort::Message>> inbox;  // by world rank
  std::map<int, std::deque<WorkerPort::KvArrival>> kv_inbox;
  std::map<int, kv::BlockPool*> pools;
  int64_t kv_bytes = 0;
};

class FakePort : public WorkerPort {
 public:
  FakePort(FakeJob& job, int rank, bool kv) : job_(job), rank_(rank), kv_(kv) {}
  int rank() const override { return rank_; }
  bool receive(Message& out) override {
    auto& q = job_.inbox[rank_];
    if (q.empty()) return false;
    out = std::move(q.front());
    q.pop_front();
    return true;
  }
  void send(int dest, MsgType type, std::vector<uint8_t> bytes) override {
    job_.inbox[dest].push_back({rank_, type, std::move(bytes)});
  }
  bool has_kv() const override { return kv_; }
  int64_t post_kv(int dest, std::span<const int32_t> src, std::span<const int32_t> dst,
                  std::span<const uint8_t> note, const KvSlice* slice) override {
    REQUIRE(slice == nullptr);  // one-rank workers move whole blocks
    kv::BlockPool& me = *job_.pools.at(rank_);
    kv::BlockPool& them = *job_.pools.at(dest);
    const std::size_t bb = me.layout().block_bytes();
    REQUIRE(src.size() == dst.size());
    for (std::size_t i = 0; i < src.size(); ++i)
      std::memcpy(reinterpret_cast<uint8_t*>(them.data()) + static_cast<std::size_t>(dst[i]) * bb,
                  reinterpret_cast<const uint8_t*>(me.data()) + static_cast<std::size_t>(src[i]) * bb, bb);
    job_.kv_bytes += static_cast<int64_t>(src.size() * bb);
    pending_[next_] = {dest, std::vector<uint8_t>(note.begin(), note.end())};
    return next_++;
  }
  KvState poll_kv(int64_t id) override {
    auto it = pending_.find(id);
    if (it != pending_.end()) {  // delivered at the sender's poll, as the loopback transport does
      job_.kv_inbox[it->second.first].push_back({rank_, false, std::move(it->second.second)});
      pending_.erase(it);
    }
    return KvState::kDone;
  }
  void release_kv(int64_t) override {}
  void kv_arrivals(std::vector<KvArrival>& out) override {
    auto& q = job_.kv_inbox[rank_];
    while (!q.empty()) {
      out.push_back(std::move(q.front()));
      q.pop_front();
    }
  }
  void flush() override {}

 private:
  FakeJob& job_;
  int rank_;
  bool kv_;
  int64_t next_ = 1;
  std::map<int64_t, std::pair<int, std::vector<uint8_t>>> pending_;
};

// One worker: pool, threads, core, port, service.
struct Worker {
  std::unique_ptr<kv::BlockPool> pool;
  std::unique_ptr<runtime::cpu::ThreadPool> threads;
  std::unique_ptr<WorkerCore> core;
  std::unique_ptr<FakePort> port;
  std::unique_ptr<WorkerService> service;
  std::optional<Role> role_seen;
};

using testing::random_prompt;

struct Job {
  testing::TinyModel& tiny;
  FakeJob fake;
  std::vector<Worker> w;  // w[k] is world rank k + 1

  // blocks: each worker's pool (the last value for the rest).
  Job(testing::TinyModel& t, int workers, bool kv, std::vector<int64_t> blocks = {256}) : tiny(t) {
    w.resize(static_cast<std::size_t>(workers));
    for (int k = 0; k < workers; ++k) {
      Worker& x = w[static_cast<std::size_t>(k)];
      x.pool = std::make_unique<kv::BlockPool>(kv::KvLayout{tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16},
                                               blocks[std::min(static_cast<std::size_t>(k), blocks.size() - 1)]);
      x.threads = std::make_unique<runtime::cpu::ThreadPool>(1);
      x.core = std::make_unique<WorkerCore>(k + 1, Role::kWorker, tiny.config,
                                            runtime::make_backend("cpu", tiny.config, *tiny.weights, *x.pool, *x.threads),
                                            *x.pool, nullptr, runtime::EngineOptions{16, 256, 0});
      fake.pools[k + 1] = x.pool.get();
      x.port = std::make_unique<FakePort>(fake, k + 1, kv);
      x.service = std::make_unique<WorkerService>(*x.core, *x.port, [&x](Role r) { x.role_seen = r; });
    }
  }
  void send(int dest, MsgType type, std::vector<uint8_t> bytes) { fake.inbox[dest].push_back({0, type, std::move(bytes)}); }
  // Ticks every worker until rank 0 has `n` results; returns them by id, and the other messages rank 0 got.
  std::map<uint64_t, WireResult> run(std::size_t n) {
    std::map<uint64_t, WireResult> results;
    for (int guard = 0; results.size() < n; ++guard) {
      REQUIRE(guard < 100000);
      for (auto& x : w) x.service->tick();
      auto& q = fake.inbox[0];
      while (!q.empty()) {
        if (q.front().type == MsgType::kResult) {
          auto r = decode_result(q.front().bytes);
          results[r.id] = std::move(r);
        }
        q.pop_front();
      }
    }
    return results;
  }
  // Shuts every worker down and ticks until all have finished; their final reports.
  std::vector<RankReport> shutdown() {
    for (std::size_t k = 0; k < w.size(); ++k) send(static_cast<int>(k) + 1, MsgType::kShutdown, {0});
    for (int guard = 0; !std::all_of(w.begin(), w.end(), [](Worker& x) { return x.service->finished(); }); ++guard) {
      REQUIRE(guard < 100000);
      for (auto& x : w) x.service->tick();
    }
    for (auto& x : w) x.service->finish();
    std::vector<RankReport> reports;
    for (auto& m : fake.inbox[0])
      if (m.type == MsgType::kReport) reports.push_back(decode_report(m.bytes));
    fake.inbox[0].clear();
    return reports;
  }
};

}  // namespace

TEST_CASE("worker service: disaggregated through the port, tokens equal the aggregated run's", "[service]") {
  testing::TinyModel tiny;
  const auto reqs = testing::wire_workload(12);
  Job agg(tiny, 1, false);
  for (const auto& r : reqs) agg.send(1, MsgType::kRequest, encode(r));
  const auto ref = agg.run(reqs.size());

  // Worker 1 prefills, worker 2 decodes: every request goes to 2 with prefill_rank 1.
  Job dis(tiny, 2, true);
  for (auto r : reqs) {
    r.prefill_rank = 1;
    dis.send(2, MsgType::kRequest, encode(r));
  }
  const auto got = dis.run(reqs.size());
  for (const auto& r : reqs) {
    INFO("request " << r.id);
    REQUIRE(got.at(r.id).ok);
    CHECK(got.at(r.id).tokens == ref.at(r.id).tokens);
    CHECK(got.at(r.id).kv_blocks_moved > 0);
    CHECK(got.at(r.id).worker == 2);
  }
  CHECK(dis.fake.kv_bytes > 0);
  const auto reports = dis.shutdown();
  REQUIRE(reports.size() == 2);
  for (const auto& rep : reports) {
    CHECK(rep.kv_blocks_used == 0);  // every block came back, on both sides
    if (rep.rank == 1) CHECK(rep.kv_bytes_sent == dis.fake.kv_bytes);
    if (rep.rank == 2) CHECK(rep.prefill_tokens < 100);  // the decode side computed no travelled prompt
  }
}

TEST_CASE("worker service: a cancel while the KV is on the way frees the blocks when it lands", "[service]") {
  testing::TinyModel tiny;
  auto reqs = testing::wire_workload(3);
  Job dis(tiny, 2, true);
  for (auto& r : reqs) {
    r.prefill_rank = 1;
    r.params.max_tokens = 40;
    dis.send(2, MsgType::kRequest, encode(r));
  }
  dis.w[1].service->tick();  // decode side: reserves blocks, sends the prefills
  dis.send(2, MsgType::kCancel, encode_cancel(1));
  const auto got = dis.run(reqs.size());
  CHECK(got.at(1).finish_reason == "abort");
  CHECK(got.at(0).tokens.size() == 40);
  CHECK(got.at(2).tokens.size() == 40);
  for (const auto& rep : dis.shutdown()) CHECK(rep.kv_blocks_used == 0);
}

TEST_CASE("worker service: a prefill refused on the prefill rank frees the decode rank's blocks", "[service]") {
  testing::TinyModel tiny;
  Job dis(tiny, 2, true, {2, 256});  // the prefill rank's pool holds 32 tokens: a 50-token prompt cannot run there
  std::mt19937 rng(3);
  WireRequest big;
  big.id = 7;
  big.prompt = random_prompt(rng, 50);
  big.params.max_tokens = 4;
  big.prefill_rank = 1;
  dis.send(2, MsgType::kRequest, encode(big));
  const auto got = dis.run(1);
  CHECK_FALSE(got.at(7).ok);
  CHECK_THAT(got.at(7).error, Catch::Contains("KV cache"));
  CHECK(got.at(7).worker == 1);
  for (const auto& rep : dis.shutdown()) CHECK(rep.kv_blocks_used == 0);
}

TEST_CASE("worker service: a re-split renames the roles; requests keep running through it", "[service]") {
  testing::TinyModel tiny;
  const auto reqs = testing::wire_workload(6);
  Job dis(tiny, 2, true);
  for (auto r : reqs) {
    r.prefill_rank = 1;
    dis.send(2, MsgType::kRequest, encode(r));
  }
  for (int k = 1; k <= 2; ++k) dis.send(k, MsgType::kRoles, encode(WireRoles{1, {2}}));  // 2 prefills from now on
  const auto got = dis.run(reqs.size());
  for (const auto& r : reqs) CHECK(got.at(r.id).ok);
  for (int guard = 0; !dis.w[0].role_seen || !dis.w[1].role_seen; ++guard) {
    REQUIRE(guard < 1000);
    for (auto& x : dis.w) x.service->tick();
  }
  CHECK(dis.w[0].role_seen == Role::kDecode);
  CHECK(dis.w[1].role_seen == Role::kPrefill);
  for (const auto& rep : dis.shutdown()) CHECK(rep.role == (rep.rank == 2 ? Role::kPrefill : Role::kDecode));
}

TEST_CASE("worker service: shutdown with abandon ends at once; without, after the last request", "[service]") {
  testing::TinyModel tiny;
  const auto reqs = testing::wire_workload(4);
  Job agg(tiny, 1, false);
  for (const auto& r : reqs) agg.send(1, MsgType::kRequest, encode(r));
  agg.send(1, MsgType::kShutdown, {0});
  agg.w[0].service->tick();
  CHECK_FALSE(agg.w[0].service->finished());  // work in hand
  const auto got = agg.run(reqs.size());
  CHECK(got.size() == reqs.size());
  for (int guard = 0; !agg.w[0].service->finished(); ++guard) {
    REQUIRE(guard < 1000);
    agg.w[0].service->tick();
  }
  Job quit(tiny, 1, false);
  for (const auto& r : reqs) quit.send(1, MsgType::kRequest, encode(r));
  quit.send(1, MsgType::kShutdown, {1});
  quit.w[0].service->tick();
  CHECK(quit.w[0].service->finished());  // abandon: the drain ran out
}

TEST_CASE("worker service: a worker that hears nothing from rank 0 for its timeout ends itself; pings keep it", "[service]") {
  testing::TinyModel tiny;
  Job job(tiny, 1, false);
  WorkerService& svc = *job.w[0].service;
  svc.set_router_timeout(0.3);
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 0 pings (MpiLink, a quarter of the timeout apart): the idle worker goes on.
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(900)) {
    job.send(1, MsgType::kPing, {});
    CHECK_NOTHROW(svc.tick());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Then silence: the first pass with nothing to do past the timeout says so.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  CHECK_THROWS_AS(svc.tick(), RouterLost);
  CHECK_THROWS_WITH(svc.tick(), Catch::Contains("rank 0 (the router) not heard from for") &&
                                    Catch::Contains("job.worker_timeout_seconds"));
  // Off (0): never.
  Job off(tiny, 1, false);
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  CHECK_NOTHROW(off.w[0].service->tick());
}

TEST_CASE("KV routes between tensor-parallel groups of different widths", "[service][tp]") {
  auto routes = [](int64_t kv, int from, int to) {
    std::vector<std::array<int64_t, 5>> out;
    for (const auto& r : shard_routes(kv, from, to)) out.push_back({r.from, r.to, r.src_head, r.dst_head, r.heads});
    return out;
  };
  using R = std::vector<std::array<int64_t, 5>>;
  CHECK(routes(4, 2, 2) == R{{0, 0, 0, 0, 2}, {1, 1, 0, 0, 2}});  // matched: each place its whole shard
  CHECK(routes(4, 4, 2) == R{{0, 0, 0, 0, 1}, {1, 0, 0, 1, 1}, {2, 1, 0, 0, 1}, {3, 1, 0, 1, 1}});
  CHECK(routes(4, 2, 4) == R{{0, 0, 0, 0, 1}, {0, 1, 1, 0, 1}, {1, 2, 0, 0, 1}, {1, 3, 1, 0, 1}});
  CHECK(routes(2, 4, 1) == R{{0, 0, 0, 0, 1}, {2, 0, 0, 1, 1}});  // replicated senders: the first copy sends
  CHECK(routes(2, 1, 4) == R{{0, 0, 0, 0, 1}, {0, 1, 0, 0, 1}, {0, 2, 1, 0, 1}, {0, 3, 1, 0, 1}});
  // Every receiving place gets each of its heads exactly once, from a place that holds it.
  for (int64_t kv : {1, 2, 4, 8})
    for (int a : {1, 2, 4, 8})
      for (int b : {1, 2, 4, 8}) {
        auto holds = [kv](int w, int p) {  // first head and count, as runtime/cpu/tp_group.h shards
          return kv >= w ? std::pair<int64_t, int64_t>{p * (kv / w), kv / w} : std::pair<int64_t, int64_t>{p * kv / w, 1};
        };
        std::map<std::pair<int, int64_t>, int> got;  // (receiving place, global head) -> times
        for (const auto& r : shard_routes(kv, a, b))
          for (int64_t h = 0; h < r.heads; ++h) {
            const int64_t g = holds(a, r.from).first + r.src_head + h;
            CHECK(g < holds(a, r.from).first + holds(a, r.from).second);
            CHECK(holds(b, r.to).first + r.dst_head + h == g);
            ++got[{r.to, g}];
          }
        std::size_t want = 0;
        for (int p = 0; p < b; ++p) want += static_cast<std::size_t>(holds(b, p).second);
        CHECK(got.size() == want);
        for (const auto& [key, n] : got) CHECK(n == 1);
      }
}

TEST_CASE("a group's KV blocks join whole on the leader and part again, at every width", "[service][tp]") {
  // 2 layers x K,V x 4 tokens = 16 rows of 2 KV heads; bf16-sized heads (8 elements, 2 bytes each).
  const int64_t kv_heads = 2, rows = 16;
  const KvShape shape{kv_heads, rows, 16};
  const int64_t whole_floats = rows * kv_heads * 16 / 4;
  std::mt19937 rng(11);
  std::vector<float> whole(static_cast<std::size_t>(2 * whole_floats));  // blocks 3 and 1 of each pool
  for (auto& x : whole) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  const std::array<int32_t, 2> ids{3, 1};
  // A pool in device memory is reached only through its copies (a GPU group's): here plain copies, counted.
  for (const bool device : {false, true})
  for (int width : {1, 2, 4}) {  // 4: each KV head on two ranks
    std::atomic<int> to_pool{0}, from_pool{0};
    kv::PoolCopy copy;
    if (device)
      copy = [&](void* dst, const void* src, std::size_t bytes, bool into) {
        ++(into ? to_pool : from_pool);
        std::memcpy(dst, src, bytes);
      };
    tandem::testing::ThreadGroup g(width);
    std::vector<std::vector<float>> shards(static_cast<std::size_t>(width));
    std::vector<float> back;
    std::vector<std::thread> ranks;
    for (int p = 0; p < width; ++p)
      ranks.emplace_back([&, p] {
        tandem::testing::ThreadGroup::Member m(g, p);
        const int64_t local = std::max<int64_t>(1, kv_heads / width);
        kv::BlockPool pool(kv::KvLayout{2, local, 4, 4, 4}, 5);  // head_dim 4 floats = 16 bytes, block_size 4
        GroupBlocks blocks(m, pool, shape, copy);
        blocks.scatter(ids, p == 0 ? whole.data() : nullptr);
        const int64_t shard_floats = pool.layout().block_floats();
        auto& mine = shards[static_cast<std::size_t>(p)];
        for (int32_t b : ids) mine.insert(mine.end(), pool.data() + b * shard_floats, pool.data() + (b + 1) * shard_floats);
        blocks.gather(ids, p == 0 ? &back : nullptr);
      });
    for (auto& t : ranks) t.join();
    INFO("width " << width << (device ? ", pool reached by copies" : ""));
    CHECK(to_pool == (device ? 2 * width : 0));  // each rank's two blocks, in and out
    CHECK(from_pool == (device ? 2 * width : 0));
    CHECK(back == whole);  // joined whole again
    for (int p = 0; p < width; ++p) {  // each rank got exactly its heads: place p holds heads p*2/width.. (as tp_group.h)
      const int64_t first = width <= kv_heads ? p * (kv_heads / width) : p * kv_heads / width;
      const int64_t n = std::max<int64_t>(1, kv_heads / width);
      std::vector<float> want;
      for (int64_t blk = 0; blk < 2; ++blk)
        for (int64_t row = 0; row < rows; ++row) {
          const float* src = whole.data() + blk * whole_floats + row * kv_heads * 4 + first * 4;
          want.insert(want.end(), src, src + n * 4);
        }
      CHECK(shards[static_cast<std::size_t>(p)] == want);
    }
  }
}

namespace {

// A model that only counts what runs: a GPU's (it draws tokens where its logits are) or not.
class CountingModel : public runtime::ModelBackend {
 public:
  explicit CountingModel(bool on_device) : on_device_(on_device) {}
  std::string_view name() const override { return "counting"; }
  void forward(std::span<const runtime::SeqChunk>, std::vector<float>& logits) override {
    ++passes;
    logits.assign(4, 0.0f);
  }
  bool forward_argmax(std::span<const runtime::SeqChunk>, std::vector<int32_t>& tokens) override {
    if (!on_device_) return false;
    ++passes;
    tokens = {7};
    return true;
  }
  bool forward_draw(std::span<const runtime::SeqChunk>, std::span<const runtime::DeviceDraw>,
                    std::vector<int32_t>& tokens) override {
    if (!on_device_) return false;
    ++passes;
    tokens = {8};
    return true;
  }
  bool has_argmax() const override { return on_device_; }
  bool has_draw() const override { return on_device_; }
  int passes = 0;

 private:
  bool on_device_;
};

}  // namespace

TEST_CASE("a group's leader draws tokens on its device when its model can, and its followers run each pass once",
          "[service][tp]") {
  for (const bool on_device : {false, true}) {
    INFO((on_device ? "a model that draws on its device" : "a model that does not"));
    FakeJob job;
    FakePort port(job, 1, false);
    const topology::GroupMap map(0, 1, 2, 2);  // one decode worker of ranks 1 and 2
    LeaderPort leader_port(port, {2}, map, KvShape{2, 4, 16});
    auto counting = std::make_unique<CountingModel>(on_device);
    CountingModel& inner = *counting;
    LeaderBackend leader(std::move(counting), leader_port);
    const std::vector<int32_t> tokens{5}, table{0};
    runtime::SeqChunk chunk;
    chunk.tokens = tokens;
    chunk.block_table = table;
    chunk.logits_last = true;
    std::vector<int32_t> drawn;
    std::vector<float> logits;
    const runtime::DeviceDraw draw{};
    // As the engine asks: argmax, else a draw on the device, else the logits.
    if (!leader.forward_argmax({&chunk, 1}, drawn)) leader.forward({&chunk, 1}, logits);
    if (!leader.forward_draw({&chunk, 1}, {&draw, 1}, drawn)) leader.forward({&chunk, 1}, logits);
    CHECK(inner.passes == 2);
    CHECK(drawn == (on_device ? std::vector<int32_t>{8} : std::vector<int32_t>{}));
    int forwards = 0;  // what the follower (rank 2) was told: each pass once
    for (const auto& m : job.inbox[2]) forwards += m.type == MsgType::kGroupForward;
    CHECK(forwards == 2);
  }
}
