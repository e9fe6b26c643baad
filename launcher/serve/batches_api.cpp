#include "launcher/serve/batches_api.h"

#include <chrono>
#include <set>

#include "common/error.h"
#include "launcher/serve/http_reply.h"

namespace tandem::launcher {
namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxBody = 1 << 20;  // a batch's parameters, not its lines

void no_such_batch(httplib::Response& res, const std::string& id) {
  send_error(res, 404, "No such Batch object: " + id, "invalid_request_error", "batch_not_found", "batch_id");
}

// metadata: null, or at most 16 string values, keys at most 64 characters, values at most 512 (OpenAI's rules).
std::string metadata_problem(const json& m) {
  if (m.is_null()) return "";
  if (!m.is_object()) return "metadata must be an object of strings (or null)";
  if (m.size() > 16) return "metadata holds at most 16 keys, not " + std::to_string(m.size());
  for (const auto& [k, v] : m.items()) {
    if (k.size() > 64) return "metadata key '" + k.substr(0, 64) + "...' is longer than 64 characters";
    if (!v.is_string()) return "metadata value of '" + k + "' must be a string";
    if (v.get<std::string>().size() > 512) return "metadata value of '" + k + "' is longer than 512 characters";
  }
  return "";
}

}  // namespace

int64_t completion_window_seconds(const std::string& w) {
  if (w.size() < 2 || w.size() > 8) return -1;
  const char unit = w.back();
  const int64_t scale = unit == 's' ? 1 : unit == 'm' ? 60 : unit == 'h' ? 3600 : 0;
  if (scale == 0 || w[0] == '0') return -1;
  int64_t n = 0;
  for (std::size_t i = 0; i + 1 < w.size(); ++i) {
    if (w[i] < '0' || w[i] > '9') return -1;
    n = n * 10 + (w[i] - '0');
  }
  const int64_t s = n * scale;
  return s >= 1 && s <= 7 * 24 * 3600 ? s : -1;
}

void add_batch_routes(httplib::Server& server, BatchRunner& runner, FileStore& files, const std::atomic<bool>& draining,
                      router::Metrics& metrics) {
  server.Post("/v1/batches", [&runner, &files, &draining, &metrics](const httplib::Request&, httplib::Response& res,
                                                                     const httplib::ContentReader& reader) {
    auto fail = [&](int status, const std::string& message, const std::string& param = "", const std::string& code = "") {
      send_error(res, status, message, status >= 500 ? "server_error" : "invalid_request_error", code, param);
      metrics.request("batches", status);
    };
    std::string body;
    bool too_large = false;
    const bool read = reader([&](const char* data, std::size_t n) {
      if (body.size() + n > kMaxBody) return !(too_large = true);
      body.append(data, n);
      return true;
    });
    if (!read || too_large) {
      res.set_header("Connection", "close");
      return too_large ? fail(413, "the body is larger than 1 MiB: a batch's lines go in its input file (POST /v1/files)")
                       : fail(400, "the body could not be read (a broken chunked encoding, or the client went away)");
    }
    if (draining) return fail(503, "the server is shutting down; create the batch when it runs again", "", "shutting_down");
    const json j = json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return fail(400, "the body is not a JSON object");
    static const std::set<std::string> known{"input_file_id", "endpoint", "completion_window", "metadata"};
    for (const auto& [k, v] : j.items())
      if (!known.count(k))
        return fail(400, "'" + k + "' is not supported by Tandem's Batches API (it takes input_file_id, endpoint, "
                             "completion_window, metadata)", k);
    for (const char* k : {"input_file_id", "endpoint", "completion_window"})
      if (!j.contains(k) || !j[k].is_string()) return fail(400, std::string("'") + k + "' is required (a string)", k);
    BatchRecord b;
    b.input_file_id = j["input_file_id"];
    b.endpoint = j["endpoint"];
    b.completion_window = j["completion_window"];
    b.metadata = j.value("metadata", json());
    if (b.endpoint != "/v1/completions" && b.endpoint != "/v1/chat/completions" && b.endpoint != "/v1/embeddings")
      return fail(400, "endpoint '" + b.endpoint + "' is not served; use /v1/chat/completions, /v1/completions or "
                       "/v1/embeddings", "endpoint");
    const int64_t window = completion_window_seconds(b.completion_window);
    if (window < 0)
      return fail(400, "completion_window '" + b.completion_window + "' is not a duration: use \"24h\" (or, in Tandem, "
                       "a whole number of s, m or h up to 7 days, e.g. \"30m\")", "completion_window");
    if (const std::string why = metadata_problem(b.metadata); !why.empty()) return fail(400, why, "metadata");
    const auto f = files.get(b.input_file_id);
    if (!f) return fail(400, "input_file_id names no file: " + b.input_file_id + " (upload it with POST /v1/files)",
                        "input_file_id");
    if (f->purpose != "batch")
      return fail(400, "file " + f->id + " has purpose '" + f->purpose + "'; a batch's input is a file of purpose "
                       "\"batch\"", "input_file_id");
    b.id = BatchStore::new_id();
    b.status = "validating";
    b.created_at = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
    b.expires_at = b.created_at + window;
    try {
      b = runner.create(std::move(b), files.content_path(f->id));
    } catch (const BatchRunner::InUse& e) {
      return fail(409, e.what(), "", "batch_dir_in_use");
    } catch (const Error& e) {
      return fail(500, std::string("the server could not keep the batch: ") + e.what());
    }
    send_json(res, 200, batch_object(b));
    metrics.request("batches", 200);
  });

  server.Get("/v1/batches", [&runner, &metrics](const httplib::Request& req, httplib::Response& res) {
    auto fail = [&](const std::string& message, const std::string& param) {
      send_error(res, 400, message, "invalid_request_error", "", param);
      metrics.request("batches", 400);
    };
    for (const auto& [name, value] : req.params)
      if (name != "limit" && name != "after") return fail("unknown query parameter '" + name + "' (known: limit, after)", name);
    const int64_t limit = list_limit(req, 20, 100);
    if (limit < 0) return fail("limit must be a whole number from 1 to 100, not '" + req.get_param_value("limit") + "'", "limit");
    const std::string after = req.get_param_value("after");
    const auto body = list_page(runner.list(), after, limit, batch_object, [](const BatchRecord&) { return true; });  // newest first
    if (!body) return fail("after names no batch: " + after, "after");
    send_json(res, 200, *body);
    metrics.request("batches", 200);
  });

  server.Get(R"(/v1/batches/([^/]+))", [&runner, &metrics](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    const auto b = BatchStore::valid_id(id) ? runner.get(id) : std::nullopt;
    if (!b) return no_such_batch(res, id), metrics.request("batches", 404);
    send_json(res, 200, batch_object(*b));
    metrics.request("batches", 200);
  });

  // Without a body as clients send it (no Content-Length either: httplib would refuse that POST unless the
  // handler reads the body itself); a body that comes is read and not used.
  server.Post(R"(/v1/batches/([^/]+)/cancel)", [&runner, &metrics](const httplib::Request& req, httplib::Response& res,
                                                                 const httplib::ContentReader& reader) {
    std::size_t got = 0;
    if ((req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) &&
        !reader([&](const char*, std::size_t n) { return (got += n) <= kMaxBody; })) {
      res.set_header("Connection", "close");
      send_error(res, 400, "the body could not be read (a cancel takes none)", "invalid_request_error");
      return metrics.request("batches", 400);
    }
    const std::string id = req.matches[1];
    bool not_running = false;
    std::optional<BatchRecord> b;
    try {
      if (BatchStore::valid_id(id)) b = runner.cancel(id, not_running);
    } catch (const BatchRunner::InUse& e) {
      send_error(res, 409, e.what(), "invalid_request_error", "batch_dir_in_use");
      return metrics.request("batches", 409);
    } catch (const Error& e) {
      send_error(res, 500, std::string("the server could not record the cancel: ") + e.what(), "server_error");
      return metrics.request("batches", 500);
    }
    if (!b) return no_such_batch(res, id), metrics.request("batches", 404);
    if (not_running) {
      send_error(res, 409, "batch " + id + " is " + b->status + ": only a batch still running can be cancelled",
                 "invalid_request_error", "batch_finished");
      return metrics.request("batches", 409);
    }
    send_json(res, 200, batch_object(*b));
    metrics.request("batches", 200);
  });
}

}  // namespace tandem::launcher
