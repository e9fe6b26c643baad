#include "launcher/serve/files_api.h"

#include <fcntl.h>
#include <unistd.h>

#include <memory>
#include <set>

#include "common/error.h"
#include "launcher/serve/http_reply.h"

namespace tandem::launcher {
namespace {

using json = nlohmann::json;

void no_such_file(httplib::Response& res, const std::string& id) {
  send_error(res, 404, "No such File object: " + id, "invalid_request_error", "file_not_found", "id");
}

// An open file read in pieces as httplib sends them (a deleted file stays readable while open).
struct OpenFile {
  int fd = -1;
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void add_file_routes(httplib::Server& server, FileStore& store, const HttpConfig& http, router::Metrics& metrics) {
  server.Post("/v1/files", [&store, &http, &metrics](const httplib::Request& req, httplib::Response& res,
                                                     const httplib::ContentReader& reader) {
    auto fail = [&](int status, const std::string& message, const std::string& param = "") {
      res.set_header("Connection", "close");  // what was not read cannot be told from a next request
      send_error(res, status, message, status >= 500 ? "server_error" : "invalid_request_error",
                 status == 413 ? "file_too_large" : "", param);
      metrics.request("files", status);
    };
    if (!req.is_multipart_form_data())
      return fail(400, "send the file as multipart/form-data with the fields 'purpose' (\"batch\") and 'file'");
    auto upload = store.begin(http.max_file_bytes);
    std::string part, purpose, filename, unknown;
    int files = 0;
    bool stopped = false;
    const bool read = reader(
        [&](const httplib::MultipartFormData& header) {
          part = header.name;
          if (part == "file") ++files, filename = header.filename;
          else if (part != "purpose" && unknown.empty()) unknown = part;
          return true;
        },
        [&](const char* data, std::size_t n) {
          if (part == "file") {
            if (files == 1 && !upload->write(data, n)) return !(stopped = true);
          } else if (part == "purpose") {
            if (purpose.size() + n > 64) return !(stopped = true);
            purpose.append(data, n);
          }
          return true;
        });
    if (upload->too_large() || (!read && res.status == 413))  // past the limit, by our count or httplib's
      return fail(413, "the file is larger than http.max_file_bytes (" + std::to_string(http.max_file_bytes) +
                           " bytes); split it, or raise http.max_file_bytes", "file");
    if (!upload->io_error().empty()) return fail(500, "the server could not store the file: " + upload->io_error());
    if (stopped) return fail(400, "'purpose' is longer than any purpose; send \"batch\"", "purpose");
    if (!read) return fail(400, "the upload could not be read (a broken multipart body, or the client went away)");
    if (!unknown.empty())
      return fail(400, "unknown field '" + unknown + "': Tandem's Files API takes 'purpose' and 'file' only", unknown);
    if (files != 1)
      return fail(400, files == 0 ? "no 'file' field: send the file's bytes as the multipart field 'file'"
                                  : "more than one 'file' field: upload one file a request",
                  "file");
    if (purpose != "batch")
      return fail(400, "purpose '" + purpose + "' is not supported: Tandem keeps files for batches; send \"batch\"",
                  "purpose");
    try {
      send_json(res, 200, file_object(upload->commit(filename.empty() ? "upload.jsonl" : filename, purpose)));
    } catch (const Error& e) {
      return fail(500, std::string("the server could not store the file: ") + e.what());
    }
    metrics.request("files", 200);
  });

  server.Get("/v1/files", [&store, &metrics](const httplib::Request& req, httplib::Response& res) {
    auto fail = [&](const std::string& message, const std::string& param) {
      send_error(res, 400, message, "invalid_request_error", "", param);
      metrics.request("files", 400);
    };
    static const std::set<std::string> known{"purpose", "limit", "order", "after"};
    for (const auto& [name, value] : req.params)
      if (!known.count(name)) return fail("unknown query parameter '" + name + "' (known: purpose, limit, order, after)", name);
    const int64_t limit = list_limit(req, 10000, 10000);
    if (limit < 0) return fail("limit must be a whole number from 1 to 10000, not '" + req.get_param_value("limit") + "'", "limit");
    const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
    if (order != "asc" && order != "desc") return fail("order must be 'asc' or 'desc', not '" + order + "'", "order");
    const std::string purpose = req.get_param_value("purpose"), after = req.get_param_value("after");
    auto files = store.list();  // newest first
    if (order == "asc") std::reverse(files.begin(), files.end());
    const auto body = list_page(files, after, limit, file_object,
                                [&](const StoredFile& f) { return purpose.empty() || f.purpose == purpose; });
    if (!body) return fail("after names no file: " + after, "after");
    send_json(res, 200, *body);
    metrics.request("files", 200);
  });

  server.Get(R"(/v1/files/([^/]+))", [&store, &metrics](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    const auto f = store.get(id);
    if (!f) return no_such_file(res, id), metrics.request("files", 404);
    send_json(res, 200, file_object(*f));
    metrics.request("files", 200);
  });

  server.Get(R"(/v1/files/([^/]+)/content)", [&store, &metrics](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    const auto f = store.get(id);
    auto file = std::make_shared<OpenFile>();
    if (f) file->fd = ::open(store.content_path(id).c_str(), O_RDONLY | O_CLOEXEC);
    if (!f || file->fd < 0) return no_such_file(res, id), metrics.request("files", 404);
    res.set_content_provider(static_cast<std::size_t>(f->bytes), "application/octet-stream",
                             [file](std::size_t offset, std::size_t length, httplib::DataSink& sink) {
                               char buf[1 << 16];
                               const auto got = ::pread(file->fd, buf, std::min(length, sizeof buf),
                                                        static_cast<off_t>(offset));
                               return got > 0 && sink.write(buf, static_cast<std::size_t>(got));
                             });
    metrics.request("files", 200);
  });

  server.Delete(R"(/v1/files/([^/]+))", [&store, &metrics](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (!store.remove(id)) return no_such_file(res, id), metrics.request("files", 404);
    send_json(res, 200, {{"id", id}, {"object", "file"}, {"deleted", true}});
    metrics.request("files", 200);
  });
}

}  // namespace tandem::launcher
