// `tandem serve`'s front end for rank 0's loop: requests that the HTTP
// threads (launcher/serve) parsed and tokenized arrive in an Inbox; the loop
// places each of their n choices, and posts streamed tokens and results back
// to the request's Exchange, waking the HTTP thread that waits on it. Epochs
// are by time: every epoch_seconds the planner sizes the next epoch from the
// requests of the last one (a server cannot see ahead).
//
// Threads: the HTTP threads only post to the Inbox and read their Exchange;
// the router thread (the loop) does everything else.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/epoch_planner.h"
#include "router/batch_request.h"
#include "router/loop/router_loop.h"
#include "router/metrics.h"
#include "router/openai_stream.h"

namespace tandem::router {

// What the router thread tells a request's HTTP thread.
struct ExchangeEvent {
  int choice = 0;
  std::vector<int32_t> tokens;                  // new tokens (streaming)
  std::optional<service::WireResult> final;     // the choice finished
  bool stopped = false;  // final: the server stopped before it finished (not an answer: a batch line is redone)
};

// One HTTP request (n choices) between its HTTP thread and the router thread.
struct Exchange {
  BatchRequest req;
  std::vector<int32_t> prompt;
  std::string endpoint;  // "completions" | "chat": the metrics label
  StreamIds ids;
  std::vector<uint64_t> wire_ids;  // router thread only

  std::mutex mu;
  std::condition_variable cv;
  std::deque<ExchangeEvent> events;  // guarded by mu
  std::atomic<bool> cancelled{false};
  // Called after each event is posted (set before the Exchange is posted to
  // the Inbox): a Batches API runner waits on many Exchanges at once.
  std::function<void()> notify;

  // Router thread: hands an event to the waiting HTTP thread.
  void post(ExchangeEvent e);
};

// Where the HTTP threads and the router thread meet.
class Inbox {
 public:
  void post(std::shared_ptr<Exchange> e);
  void cancel(std::shared_ptr<Exchange> e);
  void take(std::vector<std::shared_ptr<Exchange>>& fresh, std::vector<std::shared_ptr<Exchange>>& cancelled);
  std::size_t waiting();

  // Shared state, atomics: what /health says and what the 429 rule counts.
  std::atomic<int64_t> workers_loaded{0};
  std::atomic<bool> draining{false};
  std::atomic<int64_t> active{0};  // HTTP requests in flight (held by their threads)

 private:
  std::mutex mu_;
  std::deque<std::shared_ptr<Exchange>> fresh_, cancelled_;
};

struct HttpInboxSetup {
  uint64_t job_seed = 0;          // sampling seed for requests without one
  int64_t workers = 1;            // worker ranks that must load before /health says 200
  // job.mode = "auto": every epoch_seconds the planner sizes the next epoch
  // from the requests of the last one; the first P of worker_ranks prefill.
  planner::EpochPlanner* planner = nullptr;
  double epoch_seconds = 60;
  std::vector<int> worker_ranks;
  uint8_t pooling = 0;  // /v1/embeddings: runtime::Pooling of the checkpoint
};

class HttpInboxFrontend : public Frontend {
 public:
  HttpInboxFrontend(const HttpInboxSetup& s, Inbox& inbox, Metrics& metrics) : s_(s), inbox_(inbox), metrics_(metrics) {}
  void workers_loaded(std::size_t loaded, std::size_t want) override;
  void admit(RouterLoop& loop) override;
  void take_cancels(std::vector<uint64_t>& ids) override;
  void on_delta(service::WireDeltas::Delta& d) override;
  void on_result(service::WireResult& r) override;
  void on_stats(const service::RankReport& r) override;
  void tick(RouterLoop& loop) override;
  bool exhausted() const override { return false; }  // a server ends on a signal
  void drain_started(int signal, std::size_t in_flight) override;
  bool holds_requests() const override;
  void ended(std::vector<service::RankReport> reports, std::size_t abandoned) override;

 private:
  struct Live {
    std::shared_ptr<Exchange> ex;
    int choice = 0;
  };
  const HttpInboxSetup& s_;
  Inbox& inbox_;
  Metrics& metrics_;
  std::unordered_map<uint64_t, Live> live_;
  uint64_t next_id_ = 0;
  std::vector<std::shared_ptr<Exchange>> fresh_, cancelled_;
  bool announced_ = false;
  // The planner's epochs: the requests placed in the current one.
  std::vector<planner::Request> epoch_requests_;
  std::chrono::steady_clock::time_point epoch_start_ = std::chrono::steady_clock::now();
};

}  // namespace tandem::router
