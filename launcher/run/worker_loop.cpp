#include "launcher/run/worker_loop.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/log.h"
#include "mpi_transport/mpi_check.h"

namespace tandem::launcher {

// A worker rank under MPI: run what rank 0 (and, disaggregated, the other
// workers) send until rank 0 says stop. One loop serves every role:
//  - a request with prefill_rank < 0 runs here entirely (agg, or a short prompt);
//  - with prefill_rank >= 0 (decode side), blocks for the prompt are reserved
//    here and handed to that prefill rank, and the request continues here
//    once its KV has landed (kTagKvReady);
//  - a prefill rank runs kTagPrefill requests to their first token, puts the
//    KV into the decode rank's blocks through the transport, then notifies it.
//
// Re-splits (kTagRoles, at rank 0's epoch boundaries) change no behaviour
// here — rank 0 routes by role — only the role communicator and the rank's
// name. The loop goes on working while the workers agree on the split: a
// non-blocking barrier first (once it completes every worker has seen the
// new roles and holds back new KV sends), then MPI_Comm_split, which is then
// safe because no transfer can be waiting on a rank inside it.
void worker_loop(mpi::Mailbox& box, service::WorkerCore& core, mpi::KvTransport* transport, WorkerComms& comms) {
  auto check = [](const Status& s) {
    if (!s.ok()) throw Error(s.to_string());
  };
  auto mpi_call = [&](int rc, const char* call) {
    if (rc != MPI_SUCCESS) check(mpi::mpi_status(rc, call, __FILE__, __LINE__));
  };
  struct AwaitingKv {
    service::WireRequest request;
    std::vector<int32_t> blocks;  // cached prefix blocks, then the reserved ones
    std::chrono::steady_clock::time_point arrival;
    int64_t moved = 0;            // how many of blocks the prefill rank sends
  };
  struct Destination {
    std::vector<int32_t> blocks;
    int decode_rank;
    int64_t skip;  // leading prompt blocks the decode rank already has
  };
  std::deque<std::pair<service::WireRequest, std::chrono::steady_clock::time_point>> to_reserve;  // waiting for free blocks
  std::unordered_map<uint64_t, AwaitingKv> awaiting;
  std::unordered_map<uint64_t, Destination> destinations;
  std::deque<service::WireRoles> resplits;          // in the order rank 0 sent them
  MPI_Request resplit_barrier = MPI_REQUEST_NULL;
  std::vector<service::WorkerCore::Handoff> held;   // prefills finished during a re-split: sent after it
  mpi::Backoff backoff;
  bool stopping = false, abandon = false;
  auto last_report = std::chrono::steady_clock::now();
  // A finished prefill: its KV into the decode rank's blocks, then "ready" to that rank.
  auto send_handoff = [&](service::WorkerCore::Handoff& h) {
    auto d = destinations.find(h.id);
    if (d == destinations.end() || !transport) {
      core.release(h.kv_blocks);
      return;
    }
    // Workers' ranks in the transport's communicator are world ranks less one (rank 0 routes).
    const auto t0 = std::chrono::steady_clock::now();
    mpi::Transfer x;
    const auto skip = std::min<std::size_t>(static_cast<std::size_t>(d->second.skip), h.kv_blocks.size());
    const auto n = std::min(h.kv_blocks.size() - skip, d->second.blocks.size());
    check(transport->post(d->second.decode_rank - 1, std::span(h.kv_blocks).subspan(skip, n),
                          std::span(d->second.blocks).first(n), x));
    // Remote completion can take the peer's next loop (two-sided, NCCL): after a
    // short spin, back off so that a peer sharing this core gets to run.
    mpi::Backoff wait;
    for (int spins = 0; !x.done; ++spins) {
      check(transport->test(x));
      if (!x.done && spins >= 64) wait.idle();
    }
    core.count_kv_sent(static_cast<int64_t>(x.bytes),
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    core.release(h.kv_blocks);
    check(box.send(d->second.decode_rank, service::tag_of(service::MsgType::kKvReady), service::encode(h.ready)));
    destinations.erase(d);
  };
  // Counters for rank 0's /health and /metrics: now (this one says the model is
  // loaded), then every half second.
  check(box.send(0, service::tag_of(service::MsgType::kStats), service::encode(core.report())));
  auto last_stats = std::chrono::steady_clock::now();
  for (;;) {
    bool any = false;
    for (;;) {
      std::optional<mpi::Message> m;
      check(box.try_recv(m));
      if (!m) break;
      any = true;
      switch (m->tag) {
        case service::tag_of(service::MsgType::kRequest): {
          service::WireRequest r = service::decode_request(m->bytes);
          if (r.prefill_rank < 0) core.submit(r);
          else if (core.fits(r)) to_reserve.emplace_back(std::move(r), std::chrono::steady_clock::now());
          // else: it could never get its blocks here; refused now (the 400 goes out with the next step)
          break;
        }
        case service::tag_of(service::MsgType::kPrefill): {
          service::WirePrefill p = service::decode_prefill(m->bytes);
          destinations[p.request.id] = {std::move(p.dst_blocks), p.decode_rank, p.skip_blocks};
          core.submit(p.request, /*prefill_only=*/true);
          break;
        }
        case service::tag_of(service::MsgType::kKvReady): {
          const service::WireKvReady ready = service::decode_kv_ready(m->bytes);
          auto it = awaiting.find(ready.id);
          if (it == awaiting.end()) break;
          if (it->second.request.params.max_tokens == 0) {  // cancelled while its KV was on the way
            core.release(it->second.blocks);
            core.abort_outside(ready.id);
            awaiting.erase(it);
            break;
          }
          core.add_prefilled(it->second.request, std::move(it->second.blocks), ready, it->second.arrival,
                             it->second.moved);
          awaiting.erase(it);
          break;
        }
        case service::tag_of(service::MsgType::kCancel): {  // the client went away: free its blocks wherever the request is
          const uint64_t id = service::decode_cancel(m->bytes);
          if (m->source != 0) {  // from the prefill rank, which refused it (rank 0 has its error): no KV will come
            if (auto it = awaiting.find(id); it != awaiting.end()) {
              core.release(it->second.blocks);
              awaiting.erase(it);
            }
            break;
          }
          if (auto it = awaiting.find(id); it != awaiting.end()) {
            it->second.request.params.max_tokens = 0;  // its KV still lands in these blocks; dropped then
          } else if (auto q = std::find_if(to_reserve.begin(), to_reserve.end(),
                                           [id](const auto& e) { return e.first.id == id; });
                     q != to_reserve.end()) {
            to_reserve.erase(q);
            core.abort_outside(id);
          } else {
            core.cancel(id);
          }
          break;
        }
        case service::tag_of(service::MsgType::kRoles):
          resplits.push_back(service::decode_roles(m->bytes));
          break;
        case service::tag_of(service::MsgType::kShutdown):
          stopping = true;
          abandon = !m->bytes.empty() && m->bytes[0] != 0;
          break;
        default: break;
      }
    }
    // Decode side (oldest first): keep the prompt's prefix this rank has
    // cached, reserve blocks for the rest, and send the prefill off; only
    // the blocks after the cached prefix will travel.
    while (!to_reserve.empty()) {
      auto& [r, arrival] = to_reserve.front();
      if (!core.prefix_ready(r.prompt)) break;  // its stored prefix is on the way up from disk
      auto cached = core.cached_prefix(r.prompt);
      const int64_t bs = core.block_size();
      const int64_t total = (static_cast<int64_t>(r.prompt.size()) + bs - 1) / bs;
      const auto n_cached = static_cast<int64_t>(cached.size());
      auto fresh = core.reserve((total - n_cached) * bs);
      if (!fresh) {  // retried when finished sequences free blocks
        core.release(cached);
        break;
      }
      service::WirePrefill p{r, *fresh, 0, n_cached};
      MPI_Comm_rank(MPI_COMM_WORLD, &p.decode_rank);
      check(box.send(r.prefill_rank, service::tag_of(service::MsgType::kPrefill), service::encode(p)));
      cached.insert(cached.end(), fresh->begin(), fresh->end());
      awaiting[r.id] = {std::move(r), std::move(cached), arrival, total - n_cached};
      to_reserve.pop_front();
      any = true;
    }
    if (core.has_work()) {
      auto out = core.step();
      if (!out.deltas.deltas.empty()) check(box.send(0, service::tag_of(service::MsgType::kDeltas), service::encode(out.deltas)));
      for (auto& r : out.results) {
        // Refused on a prefill rank: rank 0 hears it from here, and the decode
        // rank frees the blocks it reserved for the KV that will not come.
        if (auto d = destinations.find(r.id); !r.ok && d != destinations.end()) {
          check(box.send(d->second.decode_rank, service::tag_of(service::MsgType::kCancel), service::encode_cancel(r.id)));
          destinations.erase(d);
        }
        check(box.send(0, service::tag_of(service::MsgType::kResult), service::encode(r)));
      }
      any = any || out.progress || !out.handoffs.empty();
      for (auto& h : out.handoffs) {
        if (resplit_barrier != MPI_REQUEST_NULL) held.push_back(std::move(h));
        else send_handoff(h);
      }
    }
    if (transport) check(transport->progress());  // two-sided: place blocks sent to us
    // Re-splits, one at a time: barrier (non-blocking), then the split.
    if (resplit_barrier == MPI_REQUEST_NULL && !resplits.empty()) {
      mpi_call(MPI_Ibarrier(comms.workers, &resplit_barrier), "MPI_Ibarrier");
    } else if (resplit_barrier != MPI_REQUEST_NULL) {
      int done = 0;
      mpi_call(MPI_Test(&resplit_barrier, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) {
        const service::WireRoles r = resplits.front();
        resplits.pop_front();
        const bool prefill = std::find(r.prefill_ranks.begin(), r.prefill_ranks.end(), comms.world_rank) !=
                             r.prefill_ranks.end();
        MPI_Comm next = MPI_COMM_NULL;
        mpi_call(MPI_Comm_split(comms.workers, prefill ? 1 : 0, comms.world_rank, &next), "MPI_Comm_split");
        if (comms.role != MPI_COMM_NULL) mpi_call(MPI_Comm_free(&comms.role), "MPI_Comm_free");
        comms.role = next;
        const std::string role = r.prefill_ranks.empty() ? "worker" : prefill ? "prefill" : "decode";
        core.set_role(role);
        log::set_identity(comms.world_rank, role);
        spdlog::debug("epoch {}: now {}", r.epoch, role);
        for (auto& h : held) send_handoff(h);
        held.clear();
        any = true;
      }
    }
    // Tell rank 0 what the prefix cache gained and lost, at most every 20 ms.
    if (std::chrono::steady_clock::now() - last_report > std::chrono::milliseconds(20)) {
      service::WireCacheEvents events;
      if (core.drain_cache_events(events)) check(box.send(0, service::tag_of(service::MsgType::kCacheEvents), service::encode(events)));
      last_report = std::chrono::steady_clock::now();
    }
    if (std::chrono::steady_clock::now() - last_stats > std::chrono::milliseconds(500)) {
      auto report = core.report();
      report.step_samples = core.take_step_samples();
      check(box.send(0, service::tag_of(service::MsgType::kStats), service::encode(report)));
      last_stats = std::chrono::steady_clock::now();
    }
    check(box.progress());
    const bool resplitting = resplit_barrier != MPI_REQUEST_NULL || !resplits.empty();
    if (stopping && !resplitting && (abandon || (!core.has_work() && awaiting.empty() && to_reserve.empty()))) break;
    if (any) backoff.reset();
    else backoff.idle();
  }
  core.close_tiers();
  auto final_report = core.report();
  final_report.step_samples = core.take_step_samples();
  check(box.send(0, service::tag_of(service::MsgType::kReport), service::encode(final_report)));
  check(box.flush());
}

}  // namespace tandem::launcher
