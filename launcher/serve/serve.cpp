#include "launcher/serve/serve.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "launcher/run/router_loop.h"
#include "runtime/service/worker_core.h"
#include "router/metrics.h"
#include "router/openai_stream.h"

namespace tandem::launcher {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// What the router thread tells a request's HTTP thread.
struct Event {
  int choice = 0;
  std::vector<int32_t> tokens;      // new tokens (streaming)
  std::optional<service::WireResult> final;  // the choice finished
};

// One HTTP request (n choices) between its HTTP thread and the router thread.
struct Exchange {
  router::BatchRequest req;
  std::vector<int32_t> prompt;
  std::string endpoint;  // "completions" | "chat": the metrics label
  router::StreamIds ids;
  Clock::time_point arrived = Clock::now();
  std::vector<uint64_t> wire_ids;  // router thread only

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> events;  // guarded by mu
  std::atomic<bool> cancelled{false};
};

// HTTP threads -> router thread.
class Inbox {
 public:
  void post(std::shared_ptr<Exchange> e) {
    std::lock_guard lock(mu_);
    fresh_.push_back(std::move(e));
  }
  void cancel(std::shared_ptr<Exchange> e) {
    std::lock_guard lock(mu_);
    cancelled_.push_back(std::move(e));
  }
  void take(std::vector<std::shared_ptr<Exchange>>& fresh, std::vector<std::shared_ptr<Exchange>>& cancelled) {
    std::lock_guard lock(mu_);
    fresh.assign(fresh_.begin(), fresh_.end());
    cancelled.assign(cancelled_.begin(), cancelled_.end());
    fresh_.clear();
    cancelled_.clear();
  }
  std::size_t waiting() {
    std::lock_guard lock(mu_);
    return fresh_.size();
  }

 private:
  std::mutex mu_;
  std::deque<std::shared_ptr<Exchange>> fresh_, cancelled_;
};

std::string served_model(const ServeSetup& s) { return s.outputs.served_name; }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                const std::string& code = "", const std::string& param = "") {
  send_json(res, status, router::error_body(message, type, code, param));
}

router::RequestResult to_result(const std::vector<int32_t>& prompt, const service::WireResult& r) {
  router::RequestResult res;
  res.prompt_ids = prompt;
  res.token_ids = r.tokens;
  res.text = r.text;
  res.finish_reason = r.finish_reason;
  res.logprobs = r.logprobs;
  res.prompt_logprobs = r.prompt_logprobs;
  res.ttft_ms = r.ttft_s * 1e3;
  res.e2e_ms = r.e2e_s * 1e3;
  res.prompt_tokens_computed = r.prompt_tokens_computed;
  res.worker = r.worker;
  res.kv_blocks_moved = r.kv_blocks_moved;
  return res;
}

}  // namespace

class HttpFrontend {
 public:
  explicit HttpFrontend(const ServeSetup& s) : s_(s), http_(s.config->http) {
    const auto threads = static_cast<std::size_t>(std::clamp<int64_t>(http_.max_in_flight + 8, 8, 1024));
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server_.set_payload_max_length(static_cast<std::size_t>(http_.max_body_bytes));
    server_.set_keep_alive_max_count(1000);
    if (!http_.api_key_env.empty()) {
      const char* key = std::getenv(http_.api_key_env.c_str());
      if (!key || !*key)
        throw Error("http.api_key_env names " + http_.api_key_env + ", which is not set (or empty) in the environment; "
                    "export it, or clear http.api_key_env to serve without a key");
      api_key_ = key;
    }
    routes();
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which lets a
    // second job bind the same port and take half of the first one's requests.
    server_.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
    });
    if (!server_.bind_to_port(http_.host, static_cast<int>(http_.port))) {
      throw Error("cannot listen on " + http_.host + ":" + std::to_string(http_.port) +
                  " (in use, or not an address of this host); set http.port / http.host");
    }
    widen_backlog();
  }

  void start() {
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  void stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  ~HttpFrontend() { stop(); }

  Inbox& inbox() { return inbox_; }
  router::Metrics& metrics() { return metrics_; }
  void set_loaded(int64_t n) { loaded_ = n; }
  void set_draining() { draining_ = true; }
  int64_t active() const { return active_.load(); }

 private:
  // Holds an in-flight slot for as long as it lives.
  struct Slot {
    explicit Slot(std::atomic<int64_t>& n) : n_(&n) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { n_->fetch_sub(1); }
    std::atomic<int64_t>* n_;
  };

  void routes() {
    server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (api_key_.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + api_key_) return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, 401, "missing or wrong API key: send 'Authorization: Bearer <the value of $" + http_.api_key_env + ">'",
                 "invalid_request_error", "invalid_api_key");
      metrics_.request(endpoint_label(req.path), 401);
      return httplib::Server::HandlerResponse::Handled;
    });
    server_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 413) {
        send_error(res, 413, "the request body is larger than http.max_body_bytes (" + std::to_string(http_.max_body_bytes) +
                                 " bytes)", "invalid_request_error", "request_too_large");
      } else if (res.status == 404) {
        send_error(res, 404, "no such endpoint: " + req.method + " " + req.path, "invalid_request_error", "not_found");
      } else {
        send_error(res, res.status, "HTTP error " + std::to_string(res.status), "invalid_request_error");
      }
      metrics_.request(endpoint_label(req.path), res.status);
    });
    server_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const bool ready = loaded_.load() >= s_.workers && !draining_.load();
      send_json(res, ready ? 200 : 503,
                {{"status", draining_ ? "draining" : ready ? "ok" : "loading"},
                 {"workers_loaded", loaded_.load()},
                 {"workers", s_.workers}});
    });
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_.render(), "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200,
                {{"object", "list"},
                 {"data", json::array({{{"id", served_model(s_)},
                                        {"object", "model"},
                                        {"created", s_.outputs.created},
                                        {"owned_by", "tandem"},
                                        {"max_model_len", s_.prompts.max_model_len}}})}});
      metrics_.request("models", 200);
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(router::Endpoint::kCompletions, req, res);
    });
    server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(router::Endpoint::kChat, req, res);
    });
  }

  static std::string endpoint_label(const std::string& path) {
    if (path == "/v1/completions") return "completions";
    if (path == "/v1/chat/completions") return "chat";
    if (path == "/v1/models") return "models";
    return "other";
  }

  void generate(router::Endpoint ep, const httplib::Request& http_req, httplib::Response& res) {
    const std::string label = ep == router::Endpoint::kChat ? "chat" : "completions";
    auto fail = [&](int status, const std::string& message, const std::string& code = "", const std::string& param = "") {
      send_error(res, status, message, status == 503 ? "server_error" : "invalid_request_error", code, param);
      metrics_.request(label, status);
    };
    if (draining_) return fail(503, "the server is shutting down; retry elsewhere", "shutting_down");
    auto parsed = router::parse_request_body(ep, http_req.body);
    if (auto* e = std::get_if<router::LineError>(&parsed)) return fail(e->status, e->message);
    auto ex = std::make_shared<Exchange>();
    ex->req = std::get<router::BatchRequest>(std::move(parsed));
    if (!ex->req.model.empty() && ex->req.model != served_model(s_)) {
      return fail(404, "The model '" + ex->req.model + "' does not exist; this server serves '" + served_model(s_) + "'",
                  "model_not_found", "model");
    }
    if (active_.fetch_add(1) >= http_.max_in_flight) {
      active_.fetch_sub(1);
      res.set_header("Retry-After", "1");
      return fail(429, "too many requests in flight (http.max_in_flight = " + std::to_string(http_.max_in_flight) +
                           "); retry shortly", "rate_limit_exceeded");
    }
    auto slot = std::make_shared<Slot>(active_);
    const uint64_t serial = serial_.fetch_add(1);
    ex->req.custom_id = "http-" + std::to_string(s_.outputs.created) + "-" + std::to_string(serial);
    auto prompt = router::build_prompt(ex->req, s_.prompts);
    if (auto* e = std::get_if<router::LineError>(&prompt)) return fail(e->status, e->message);
    ex->prompt = std::get<std::vector<int32_t>>(std::move(prompt));
    ex->endpoint = label;
    ex->ids.id = router::derived_id(ep == router::Endpoint::kChat ? "chatcmpl-" : "cmpl-", ex->req.custom_id);
    ex->ids.model = ex->req.model.empty() ? served_model(s_) : ex->req.model;
    ex->ids.created = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
    inbox_.post(ex);
    if (ex->req.stream) return stream(ex, std::move(slot), res);

    // Not streaming: wait for every choice.
    std::vector<std::optional<service::WireResult>> finals(static_cast<std::size_t>(ex->req.n));
    std::size_t done = 0;
    std::unique_lock lock(ex->mu);
    while (done < finals.size()) {
      ex->cv.wait(lock, [&] { return !ex->events.empty(); });
      while (!ex->events.empty()) {
        Event e = std::move(ex->events.front());
        ex->events.pop_front();
        if (e.final) {
          finals[static_cast<std::size_t>(e.choice)] = std::move(e.final);
          ++done;
        }
      }
    }
    lock.unlock();
    std::vector<router::RequestResult> results;
    for (auto& f : finals) {
      if (!f->ok) return fail(400, f->error);
      results.push_back(to_result(ex->prompt, *f));
    }
    router::OutputContext outputs = s_.outputs;
    outputs.created = ex->ids.created;  // this request's time, as its stream's chunks carry (not the server's start)
    send_json(res, 200, router::response_body(ex->req, results, outputs, ex->ids.id));
    res.body.push_back('\n');
    metrics_.request(label, 200);
  }

  // Server-Sent Events: a role chunk per choice (chat), text as it comes (held
  // back near possible stop strings), a last chunk per choice with its
  // finish_reason (and logprobs, when asked), usage when asked, [DONE].
  void stream(std::shared_ptr<Exchange> ex, std::shared_ptr<Slot> slot, httplib::Response& res) {
    struct State {
      std::vector<router::StreamText> text;
      std::vector<bool> started, finished;
      int64_t completion_tokens = 0;
      bool head_sent = false;
      bool failed = false;
    };
    auto st = std::make_shared<State>();
    for (int64_t i = 0; i < ex->req.n; ++i) st->text.emplace_back(s_.prompts.tokenizer, ex->req.params.stop);
    st->started.assign(static_cast<std::size_t>(ex->req.n), false);
    st->finished.assign(static_cast<std::size_t>(ex->req.n), false);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    const std::string label = ex->endpoint;
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ex, st, label](std::size_t, httplib::DataSink& sink) {
          std::string out;
          auto chunk = [&](int64_t index, const std::string& text, const std::string* finish, const json* lps) {
            out += router::sse(router::stream_chunk(ex->req, ex->ids, index, text,
                                                    !st->started[static_cast<std::size_t>(index)], finish, lps));
            st->started[static_cast<std::size_t>(index)] = true;
          };
          if (!st->head_sent) {  // chat: the assistant's role first, as OpenAI sends it
            st->head_sent = true;
            for (int64_t i = 0; i < ex->req.n; ++i) {
              std::string head;
              if (ex->req.endpoint == router::Endpoint::kCompletions && ex->req.echo)
                head = ex->req.prompt_text ? *ex->req.prompt_text : s_.prompts.tokenizer->decode(ex->prompt, false);
              if (ex->req.endpoint == router::Endpoint::kChat || !head.empty()) chunk(i, head, nullptr, nullptr);
            }
          }
          std::deque<Event> events;
          {
            std::unique_lock lock(ex->mu);
            ex->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return !ex->events.empty(); });
            events.swap(ex->events);
          }
          for (auto& e : events) {
            const auto c = static_cast<std::size_t>(e.choice);
            if (st->finished[c]) continue;
            if (!e.final) {
              std::string t = st->text[c].push(e.tokens);
              if (!t.empty()) chunk(e.choice, t, nullptr, nullptr);
              continue;
            }
            st->finished[c] = true;
            const service::WireResult& r = *e.final;
            std::string finish = r.ok ? r.finish_reason : "abort";
            std::optional<std::string> rest = r.ok ? st->text[c].finish(r.text) : std::string();
            if (!rest) {
              spdlog::warn("{}: streamed text is not a prefix of the final text; the stream ends here", ex->ids.id);
              rest = std::string();
            }
            st->completion_tokens += static_cast<int64_t>(r.tokens.size());
            json lps;
            const json* lp = nullptr;
            if (r.ok && ex->req.params.logprobs >= 0) {
              router::RequestResult one = to_result(ex->prompt, r);
              lps = router::response_body(ex->req, {one}, s_.outputs, ex->ids.id)["choices"][0]["logprobs"];
              lp = &lps;
            }
            if (!rest->empty()) chunk(e.choice, *rest, nullptr, nullptr);
            chunk(e.choice, "", &finish, lp);
          }
          const bool all_done = std::all_of(st->finished.begin(), st->finished.end(), [](bool f) { return f; });
          if (all_done) {
            if (ex->req.include_usage)
              out += router::sse(router::usage_chunk(ex->req, ex->ids, static_cast<int64_t>(ex->prompt.size()),
                                                     st->completion_tokens));
            out += router::sse_done();
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            st->failed = true;
            return false;  // the client is gone
          }
          if (all_done) sink.done();
          return true;
        },
        [this, ex, st, slot, label](bool success) {
          const bool complete = std::all_of(st->finished.begin(), st->finished.end(), [](bool f) { return f; });
          if (!success || !complete) {  // dropped mid-stream: free its KV blocks everywhere
            ex->cancelled = true;
            inbox_.cancel(ex);
            metrics_.request(label, 499);  // nginx's "client closed request"
          } else {
            metrics_.request(label, 200);
          }
        });
  }

  // Debian's cpp-httplib 0.11 is compiled with a listen backlog of 5: a burst
  // of new connections overflows it, SYNs are dropped and clients wait out
  // retransmissions (1, 3, 7 s), past their connect timeouts on a loaded
  // node. Listening again on the same socket sets a new backlog (Linux), so
  // find our listening socket and give it SOMAXCONN.
  void widen_backlog() const {
    for (int fd = 3; fd < 4096; ++fd) {
      int listening = 0;
      socklen_t len = sizeof listening;
      if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
      sockaddr_storage addr{};
      socklen_t alen = sizeof addr;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
      const int port = addr.ss_family == AF_INET    ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                       : addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                                    : -1;
      if (port == http_.port && ::listen(fd, SOMAXCONN) == 0) return;
    }
    spdlog::warn("could not raise the HTTP listen backlog; bursts of new connections may be slow to connect");
  }

  const ServeSetup& s_;
  HttpConfig http_;
  std::string api_key_;
  httplib::Server server_;
  std::thread thread_;
  Inbox inbox_;
  router::Metrics metrics_;
  std::atomic<int64_t> loaded_{0};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_{0};
  std::atomic<uint64_t> serial_{0};
};

FrontendPtr bind_frontend(const ServeSetup& setup) { return FrontendPtr(new HttpFrontend(setup)); }
void FrontendDeleter::operator()(HttpFrontend* f) const { delete f; }

int run_serve(const ServeSetup& s, HttpFrontend& front, router::WorkerLink& link) {
  const HttpConfig& http = s.config->http;
  router::Dispatcher dispatch(link, s.dispatch);
  front.start();
  spdlog::info("serving {} on http://{}:{} (OpenAI API: /v1/completions, /v1/chat/completions, /v1/models; /health, "
               "/metrics)", s.outputs.served_name, http.host, http.port);

  struct Live {
    std::shared_ptr<Exchange> ex;
    int choice = 0;
  };
  std::unordered_map<uint64_t, Live> live;
  std::unordered_map<int, bool> loaded;
  uint64_t next_id = 0;
  router::LinkEvents events;
  std::vector<std::shared_ptr<Exchange>> fresh, cancelled;
  bool draining = false, cancelled_all = false;
  Clock::time_point deadline;
  // The planner's epochs: the requests placed in the current one.
  std::vector<planner::Request> epoch_requests;
  auto epoch_start = Clock::now();
  bool announced = false;

  auto post = [](Exchange& ex, Event e) {
    {
      std::lock_guard lock(ex.mu);
      ex.events.push_back(std::move(e));
    }
    ex.cv.notify_all();
  };

  for (;;) {
    if (!draining && g_stop_signal.load() != 0) {
      draining = true;
      front.set_draining();
      deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(http.drain_seconds * 1e3));
      spdlog::info("signal {}: no new requests; finishing {} in flight for up to {:g} s", g_stop_signal.load(),
                   live.size(), http.drain_seconds);
    }
    front.inbox().take(fresh, cancelled);
    for (auto& ex : fresh) {
      if (ex->cancelled) {  // gone before it was placed
        for (int64_t c = 0; c < ex->req.n; ++c) post(*ex, Event{static_cast<int>(c), {}, service::WireResult{}});
        continue;
      }
      for (int64_t c = 0; c < ex->req.n; ++c) {
        service::WireRequest w;
        w.id = next_id++;
        w.prompt = ex->prompt;
        w.params = ex->req.params;
        // Choice 0 samples as `tandem run` would for the same request; the others on keys of their own.
        w.rng_key = router::sampling_key(ex->req.seed_given, ex->req.params.seed, static_cast<uint64_t>(s.config->job.seed),
                                 ex->req.custom_id);
        if (c > 0) w.rng_key = router::sampling_key(true, w.rng_key + static_cast<uint64_t>(c), 0, "");
        w.stream = ex->req.stream;
        ex->wire_ids.push_back(w.id);
        live[w.id] = {ex, static_cast<int>(c)};
        if (s.planner)
          epoch_requests.push_back({static_cast<int64_t>(w.prompt.size()), w.params.max_tokens, 0, 0, -1});
        dispatch.submit(std::move(w));
      }
    }
    for (auto& ex : cancelled)
      for (uint64_t id : ex->wire_ids)
        if (live.count(id)) dispatch.cancel(id);

    events.clear();
    dispatch.poll(events);
    for (const auto& r : events.stats) {
      if (s.planner) s.planner->observe(r.step_samples);
      loaded[r.rank] = true;
      front.metrics().set_rank({r.rank, r.role, r.kv_blocks_used, r.kv_blocks_total, r.kv_bytes_sent, r.prefix_hit_tokens,
                                r.hit_tokens_by_tier, r.tiers});
    }
    front.set_loaded(static_cast<int64_t>(loaded.size()));
    front.metrics().set_workers_loaded(static_cast<int64_t>(loaded.size()), s.workers);
    if (!announced && static_cast<int64_t>(loaded.size()) >= s.workers) {
      announced = true;
      spdlog::info("all {} worker(s) loaded: /health is 200", s.workers);
    }
    for (auto& d : events.deltas) {
      auto it = live.find(d.id);
      if (it != live.end()) post(*it->second.ex, Event{it->second.choice, std::move(d.tokens), std::nullopt});
    }
    for (auto& r : events.results) {
      auto it = live.find(r.id);
      if (it == live.end()) continue;
      const auto n = static_cast<double>(r.tokens.size());
      if (r.ok && r.finish_reason != "abort")
        front.metrics().generation(r.ttft_s, n > 1 ? (r.e2e_s - r.ttft_s) / (n - 1) : 0.0, r.e2e_s,
                                   static_cast<int64_t>(it->second.ex->prompt.size()), static_cast<int64_t>(r.tokens.size()),
                                   r.prompt_tokens_computed);
      auto ex = it->second.ex;
      const int choice = it->second.choice;
      live.erase(it);
      post(*ex, Event{choice, {}, std::move(r)});
    }
    front.metrics().set_in_flight(static_cast<int64_t>(live.size()), static_cast<int64_t>(front.inbox().waiting()));
    // An epoch ends: a server cannot see ahead, so the next one is sized from the last.
    if (s.planner && !draining &&
        std::chrono::duration<double>(Clock::now() - epoch_start).count() >= s.epoch_seconds) {
      if (!epoch_requests.empty()) {
        const auto d = s.planner->decide(epoch_requests);
        if (d.changed()) {
          std::vector<int> prefill(s.worker_ranks.begin(), s.worker_ranks.begin() + d.split.prefill);
          if (link.set_roles(d.epoch, prefill)) dispatch.refresh();
        }
        spdlog::info("{} (from the last {:g} s: {} requests)", d.describe(), s.epoch_seconds, epoch_requests.size());
        epoch_requests.clear();
      }
      epoch_start = Clock::now();
    }

    if (draining) {
      if (live.empty() && front.inbox().waiting() == 0 && front.active() == 0) break;
      if (Clock::now() >= deadline) {
        if (!cancelled_all) {
          spdlog::warn("drain time is up: cancelling {} request(s) still running", live.size());
          for (const auto& [id, l] : live) dispatch.cancel(id);
          cancelled_all = true;
          deadline = Clock::now() + std::chrono::seconds(5);  // for the aborts to come back
        } else {
          break;
        }
      }
    }
  }
  front.stop();
  link.shutdown(!live.empty());
  spdlog::info("server stopped");
  return 0;
}

}  // namespace tandem::launcher
