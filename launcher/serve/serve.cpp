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
#include "launcher/serve/batches_api.h"
#include "launcher/serve/files_api.h"
#include "launcher/serve/guarded_server.h"
#include "launcher/serve/http_reply.h"
#include "launcher/stop_signals.h"
#include "router/dispatcher.h"
#include "runtime/service/worker_core.h"
#include "router/loop/http_inbox.h"
#include "router/metrics.h"
#include "router/openai_stream.h"

namespace tandem::launcher {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

using router::Exchange;
using router::ExchangeEvent;
using router::Inbox;

std::string served_model(const ServeSetup& s) { return s.outputs.served_name; }


}  // namespace

class HttpFrontend {
 public:
  explicit HttpFrontend(const ServeSetup& s)
      : s_(s),
        http_(s.config->http),
        files_(http_.batch_dir),
        batches_(http_.batch_dir),
        server_(http_.head_timeout_seconds, static_cast<int>(max_slow_heads(http_))) {
    const auto threads = static_cast<std::size_t>(std::clamp<int64_t>(http_.max_in_flight + 8, 8, 1024));
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    // The larger of the two (a file's multipart framing on top): read_body bounds every other body by
    // http.max_body_bytes itself, the Files API a file by http.max_file_bytes.
    server_.set_payload_max_length(
        static_cast<std::size_t>(std::max(http_.max_body_bytes, http_.max_file_bytes + (int64_t{64} << 10))));
    server_.set_keep_alive_max_count(1000);
    if (!http_.api_key_env.empty()) {
      const char* key = std::getenv(http_.api_key_env.c_str());
      if (!key || !*key)
        throw Error("http.api_key_env names " + http_.api_key_env + ", which is not set (or empty) in the environment; "
                    "export it, or clear http.api_key_env to serve without a key");
      api_key_ = key;
    }
    BatchRunnerSetup b;
    b.prompts = &s.prompts;
    b.outputs = s.outputs;
    b.pooling = s.pooling;
    b.hidden = s.hidden;
    b.job_seed = static_cast<uint64_t>(s.config->job.seed);
    b.max_line_bytes = s.max_line_bytes;
    b.in_flight = http_.batch_in_flight > 0 ? http_.batch_in_flight : s.config->job.max_num_seqs * std::max<int64_t>(1, s.workers);
    b.flush_seconds = s.config->job.flush_seconds;
    b.progress_seconds = s.config->job.progress_seconds;
    runner_ = std::make_unique<BatchRunner>(std::move(b), batches_, files_, inbox_);
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
    runner_->start();
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  // After rank 0's loop has ended: the HTTP threads, then the batches (what they have done committed).
  void stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
    runner_->stop();
  }
  ~HttpFrontend() { stop(); }

  Inbox& inbox() { return inbox_; }
  router::Metrics& metrics() { return metrics_; }

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
      if (const std::string why = bad_headers(req); !why.empty()) {  // before any body is read
        res.set_header("Connection", "close");
        send_error(res, 400, "bad request: " + why, "invalid_request_error");
        metrics_.request(endpoint_label(req.path), 400);
        return httplib::Server::HandlerResponse::Handled;
      }
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
      const bool ready = inbox_.workers_loaded.load() >= s_.workers && !inbox_.draining.load();
      send_json(res, ready ? 200 : 503,
                {{"status", inbox_.draining ? "draining" : ready ? "ok" : "loading"},
                 {"workers_loaded", inbox_.workers_loaded.load()},
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
    // The body is read here, bounded as it comes: httplib bounds a body
    // with a Content-Length, but reads a chunked one whole into memory.
    server_.Post("/v1/completions",
                 [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                   if (read_body(req, res, reader)) generate(router::Endpoint::kCompletions, req, res);
                 });
    server_.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                   if (read_body(req, res, reader)) generate(router::Endpoint::kChat, req, res);
                 });
    server_.Post("/v1/embeddings",
                 [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                   if (read_body(req, res, reader)) generate(router::Endpoint::kEmbeddings, req, res);
                 });
    add_file_routes(server_, files_, http_, metrics_);
    add_batch_routes(server_, *runner_, files_, inbox_.draining, metrics_);
  }

  // Reads a request's body into req.body, at most http.max_body_bytes of it
  // whatever its framing: past that, 413 at once (the rest is not read, and
  // the connection closes, as its remaining bytes cannot be told from a next
  // request). False when the answer is sent.
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    auto& body = const_cast<httplib::Request&>(req).body;  // httplib's handlers take the request const
    const auto limit = static_cast<std::size_t>(http_.max_body_bytes);
    bool too_large = false;
    const bool read = reader([&](const char* data, std::size_t n) {
      if (body.size() + n > limit) {
        too_large = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    if (read && !too_large) return true;
    body.clear();
    body.shrink_to_fit();
    res.set_header("Connection", "close");
    const std::string label = endpoint_label(req.path);
    if (too_large || res.status == 413) {
      send_error(res, 413, "the request body is larger than http.max_body_bytes (" + std::to_string(http_.max_body_bytes) +
                               " bytes)", "invalid_request_error", "request_too_large");
      metrics_.request(label, 413);
    } else {
      send_error(res, 400, "the request body could not be read (a broken chunked encoding, or the client went away)",
                 "invalid_request_error");
      metrics_.request(label, 400);
    }
    return false;
  }

  // RFC 9112's rules for a request's framing and header values, which
  // httplib does not apply: a CR, LF or NUL inside a field value, two
  // different Content-Lengths, or a Content-Length beside a
  // Transfer-Encoding is refused (each lets a proxy and this server see
  // different requests in the same bytes). "" when the headers are fine.
  static std::string bad_headers(const httplib::Request& req) {
    for (const auto& [name, value] : req.headers)
      for (const char c : value)
        if (c == '\r' || c == '\n' || c == '\0')
          return "the header '" + name + "' holds a " + (c == '\0' ? std::string("NUL") : c == '\r' ? "bare CR" : "LF") +
                 " byte, which RFC 9112 forbids in a field value";
    const auto lengths = req.headers.equal_range("Content-Length");
    for (auto it = lengths.first; it != lengths.second; ++it)
      if (it->second != lengths.first->second)
        return "two different Content-Length headers ('" + lengths.first->second + "' and '" + it->second + "')";
    if (lengths.first != lengths.second && req.has_header("Transfer-Encoding"))
      return "both Content-Length and Transfer-Encoding are given; send one";
    return "";
  }

  static std::string endpoint_label(const std::string& path) {
    if (path == "/v1/completions") return "completions";
    if (path == "/v1/chat/completions") return "chat";
    if (path == "/v1/embeddings") return "embeddings";
    if (path == "/v1/models") return "models";
    if (path.rfind("/v1/files", 0) == 0) return "files";
    if (path.rfind("/v1/batches", 0) == 0) return "batches";
    return "other";
  }

  void generate(router::Endpoint ep, const httplib::Request& http_req, httplib::Response& res) {
    const std::string label = ep == router::Endpoint::kChat         ? "chat"
                              : ep == router::Endpoint::kEmbeddings ? "embeddings"
                                                                    : "completions";
    auto fail = [&](int status, const std::string& message, const std::string& code = "", const std::string& param = "") {
      send_error(res, status, message, status == 503 ? "server_error" : "invalid_request_error", code, param);
      metrics_.request(label, status);
    };
    if (inbox_.draining) return fail(503, "the server is shutting down; retry elsewhere", "shutting_down");
    auto parsed = router::parse_request_body(ep, http_req.body);
    if (auto* e = std::get_if<router::LineError>(&parsed)) return fail(e->status, e->message);
    auto ex = std::make_shared<Exchange>();
    ex->req = std::get<router::BatchRequest>(std::move(parsed));
    if (!ex->req.model.empty() && ex->req.model != served_model(s_)) {
      return fail(404, "The model '" + ex->req.model + "' does not exist; this server serves '" + served_model(s_) + "'",
                  "model_not_found", "model");
    }
    if (inbox_.active.fetch_add(1) >= http_.max_in_flight) {
      inbox_.active.fetch_sub(1);
      res.set_header("Retry-After", "1");
      return fail(429, "too many requests in flight (http.max_in_flight = " + std::to_string(http_.max_in_flight) +
                           "); retry shortly", "rate_limit_exceeded");
    }
    auto slot = std::make_shared<Slot>(inbox_.active);
    const uint64_t serial = serial_.fetch_add(1);
    ex->req.custom_id = "http-" + std::to_string(s_.outputs.created) + "-" + std::to_string(serial);
    auto prompt = router::build_prompt(ex->req, s_.prompts);
    if (auto* e = std::get_if<router::LineError>(&prompt)) return fail(e->status, e->message);
    ex->prompt = std::get<std::vector<int32_t>>(std::move(prompt));
    if (ep == router::Endpoint::kEmbeddings && !s_.pooling.error.empty()) return fail(400, s_.pooling.error);
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
        ExchangeEvent e = std::move(ex->events.front());
        ex->events.pop_front();
        if (e.final) {
          finals[static_cast<std::size_t>(e.choice)] = std::move(e.final);
          ++done;
        }
      }
    }
    lock.unlock();
    if (ep == router::Endpoint::kEmbeddings) {  // the same vectors a batch line gets
      const auto& f = *finals[0];
      if (!f.ok) return fail(400, f.error);
      if (f.finish_reason == "abort") return fail(503, "the server stopped the request; retry", "shutting_down");
      const auto result = router::embedding_result_of(ex->req, f.embedding, s_.hidden, s_.pooling, f.e2e_s,
                                                      f.prompt_tokens_computed, f.worker);
      send_json(res, 200, router::embedding_body(ex->req, result, s_.outputs));
      res.body.push_back('\n');
      metrics_.request(label, 200);
      return;
    }
    std::vector<router::RequestResult> results;
    for (auto& f : finals) {
      if (!f->ok) return fail(400, f->error);
      results.push_back(router::result_of(ex->prompt, *f));
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
    const bool calls = ex->req.tools && ex->req.tools->choice != router::ToolChoice::kNone;
    for (int64_t i = 0; i < ex->req.n; ++i)
      st->text.emplace_back(s_.prompts.tokenizer, ex->req.params.stop,
                            calls ? ex->req.tool_format : runtime::ToolFormat::kNone, ex->req.tool_marker);
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
          std::deque<ExchangeEvent> events;
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
            const auto answer = r.ok ? router::tool_answer(ex->req, r.text, r.tokens, s_.prompts.tokenizer, c) : std::nullopt;
            std::optional<std::string> rest = r.ok ? st->text[c].finish(answer ? answer->content : r.text) : std::string();
            if (!rest) {
              spdlog::warn("{}: streamed text is not a prefix of the final text; the stream ends here", ex->ids.id);
              rest = std::string();
            }
            st->completion_tokens += static_cast<int64_t>(r.tokens.size());
            json lps;
            const json* lp = nullptr;
            if (r.ok && ex->req.params.logprobs >= 0) {
              router::RequestResult one = router::result_of(ex->prompt, r);
              lps = router::response_body(ex->req, {one}, s_.outputs, ex->ids.id)["choices"][0]["logprobs"];
              lp = &lps;
            }
            if (!rest->empty()) chunk(e.choice, *rest, nullptr, nullptr);
            if (answer) {
              out += router::sse(router::tool_calls_chunk(ex->req, ex->ids, e.choice, answer->calls, !st->started[c]));
              st->started[c] = true;
              if (finish == "stop") finish = "tool_calls";
            }
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

  // Heads still arriving a tenth of a second after their first byte, at most: a sixteenth of the threads.
  static int64_t max_slow_heads(const HttpConfig& h) { return std::max<int64_t>(8, (h.max_in_flight + 8) / 16); }

  const ServeSetup& s_;
  HttpConfig http_;
  FileStore files_;      // http.batch_dir/files
  BatchStore batches_;   // http.batch_dir/batches
  std::string api_key_;
  GuardedServer server_;
  std::thread thread_;
  Inbox inbox_;
  router::Metrics metrics_;
  std::atomic<uint64_t> serial_{0};
  std::unique_ptr<BatchRunner> runner_;  // last: it posts to inbox_
};

FrontendPtr bind_frontend(const ServeSetup& setup) { return FrontendPtr(new HttpFrontend(setup)); }
void FrontendDeleter::operator()(HttpFrontend* f) const { delete f; }

// The HTTP threads answer; this thread runs rank 0's loop with the HTTP inbox as its front end.
int run_serve(const ServeSetup& s, HttpFrontend& front, router::WorkerLink& link) {
  const HttpConfig& http = s.config->http;
  router::HttpInboxSetup inbox_setup;
  inbox_setup.job_seed = static_cast<uint64_t>(s.config->job.seed);
  inbox_setup.workers = s.workers;
  inbox_setup.planner = s.planner;
  inbox_setup.epoch_seconds = s.epoch_seconds;
  inbox_setup.worker_ranks = s.worker_ranks;
  inbox_setup.pooling = static_cast<uint8_t>(s.pooling.pooling);
  router::HttpInboxFrontend inbox_front(inbox_setup, front.inbox(), front.metrics());
  router::LoopOptions o;
  o.drain_seconds = http.drain_seconds;
  o.abort_grace_seconds = 5;  // after the drain: requests still running are cancelled, their aborts answered
  o.stop_signal = &g_stop_signal;
  o.worker_timeout_seconds = s.worker_timeout_seconds;
  router::RouterLoop loop(link, s.dispatch, o);
  front.start();
  spdlog::info("serving {} on http://{}:{} (OpenAI API: /v1/completions, /v1/chat/completions, /v1/embeddings, /v1/models, "
               "/v1/files, /v1/batches; /health, /metrics)", s.outputs.served_name, http.host, http.port);
  loop.run(inbox_front);
  front.stop();
  return 0;
}

}  // namespace tandem::launcher
