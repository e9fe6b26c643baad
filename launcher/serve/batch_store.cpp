#include "launcher/serve/batch_store.h"

#include <algorithm>
#include <fstream>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "launcher/serve/file_store.h"

namespace tandem::launcher {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kTimes[] = {"in_progress_at", "finalizing_at", "completed_at", "failed_at",
                                  "expired_at",     "cancelling_at", "cancelled_at"};

json record_json(const BatchRecord& b) {
  json j = batch_object(b);
  j["tandem"] = {{"committed_bytes", b.counts.committed_bytes}};
  return j;
}

std::optional<BatchRecord> record_of(const json& j) {
  if (!j.is_object() || !j.contains("id") || !j.contains("status")) return std::nullopt;
  BatchRecord b;
  b.id = j.value("id", std::string());
  b.endpoint = j.value("endpoint", std::string());
  b.input_file_id = j.value("input_file_id", std::string());
  b.completion_window = j.value("completion_window", std::string());
  b.status = j.value("status", std::string());
  b.metadata = j.value("metadata", json());
  b.created_at = j.value("created_at", int64_t{0});
  b.expires_at = j.value("expires_at", int64_t{0});
  for (const char* t : kTimes)
    if (j.contains(t) && j[t].is_number_integer()) b.times[t] = j[t].get<int64_t>();
  if (j.contains("output_file_id") && j["output_file_id"].is_string()) b.output_file_id = j["output_file_id"];
  if (j.contains("error_file_id") && j["error_file_id"].is_string()) b.error_file_id = j["error_file_id"];
  if (j.contains("errors") && j["errors"].is_object()) b.errors = j["errors"].value("data", json());
  const json counts = j.value("request_counts", json::object());
  b.counts.total = counts.value("total", int64_t{0});
  b.counts.completed = counts.value("completed", int64_t{0});
  b.counts.failed = counts.value("failed", int64_t{0});
  const json usage = j.value("usage", json::object());
  b.counts.input_tokens = usage.value("input_tokens", int64_t{0});
  b.counts.output_tokens = usage.value("output_tokens", int64_t{0});
  b.counts.committed_bytes = j.value("tandem", json::object()).value("committed_bytes", int64_t{0});
  return b;
}

}  // namespace

bool BatchRecord::unfinished() const {
  return status == "validating" || status == "in_progress" || status == "finalizing" || status == "cancelling";
}

json batch_object(const BatchRecord& b) {
  json j = {{"id", b.id},
            {"object", "batch"},
            {"endpoint", b.endpoint},
            {"errors", b.errors.is_null() ? json(nullptr) : json{{"object", "list"}, {"data", b.errors}}},
            {"input_file_id", b.input_file_id},
            {"completion_window", b.completion_window},
            {"status", b.status},
            {"output_file_id", b.output_file_id.empty() ? json(nullptr) : json(b.output_file_id)},
            {"error_file_id", b.error_file_id.empty() ? json(nullptr) : json(b.error_file_id)},
            {"created_at", b.created_at},
            {"expires_at", b.expires_at},
            {"request_counts", {{"total", b.counts.total}, {"completed", b.counts.completed}, {"failed", b.counts.failed}}},
            {"usage",
             {{"input_tokens", b.counts.input_tokens},
              {"input_tokens_details", {{"cached_tokens", 0}}},
              {"output_tokens", b.counts.output_tokens},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", b.counts.input_tokens + b.counts.output_tokens}}},
            {"metadata", b.metadata}};
  for (const char* t : kTimes) {
    const auto it = b.times.find(t);
    j[t] = it == b.times.end() ? json(nullptr) : json(it->second);
  }
  return j;
}

BatchStore::BatchStore(const fs::path& batch_dir) : dir_(batch_dir / "batches") {
  std::error_code ec;
  if (fs::exists(dir_, ec) && !fs::is_directory(dir_, ec))
    throw Error(dir_.string() + " is not a folder; set http.batch_dir to a folder this job may write");
}

void BatchStore::sweep() {
  std::lock_guard lock(mu_);
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return;
  std::vector<fs::path> folders;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const fs::path p = e.path();
    if (p.extension() == ".part") fs::remove(p, ec);  // a record a killed server was replacing: the one before it stands
    else if (e.is_directory(ec) && valid_id(p.filename().string())) folders.push_back(p);
  }
  for (const auto& f : folders) {  // a work folder outlives its batch only when it failed (its answers kept)
    const auto b = read(f.filename().string());
    if (!b || (!b->unfinished() && b->status != "failed")) fs::remove_all(f, ec);
  }
}

std::optional<BatchRecord> BatchStore::read(const std::string& id) const {
  std::ifstream in(dir_ / (id + ".json"));
  if (!in) return std::nullopt;
  const json j = json::parse(in, nullptr, false);
  auto b = j.is_discarded() ? std::nullopt : record_of(j);
  if (!b || b->id != id) {
    spdlog::warn("{}: not a batch record Tandem wrote; it is left alone and not listed", (dir_ / (id + ".json")).string());
    return std::nullopt;
  }
  return b;
}

void BatchStore::save(const BatchRecord& b) {
  std::lock_guard lock(mu_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  write_whole(dir_ / (b.id + ".json"), record_json(b).dump() + "\n");
}

std::optional<BatchRecord> BatchStore::get(const std::string& id) const {
  if (!valid_id(id)) return std::nullopt;
  std::lock_guard lock(mu_);
  return read(id);
}

std::vector<BatchRecord> BatchStore::list() const {
  std::vector<BatchRecord> all;
  {
    std::lock_guard lock(mu_);
    std::error_code ec;
    if (!fs::is_directory(dir_, ec)) return {};
    for (const auto& e : fs::directory_iterator(dir_, ec))
      if (e.path().extension() == ".json" && valid_id(e.path().stem().string()))
        if (auto b = read(e.path().stem().string())) all.push_back(std::move(*b));
  }
  std::sort(all.begin(), all.end(), [](const BatchRecord& a, const BatchRecord& b) {
    return a.created_at != b.created_at ? a.created_at > b.created_at : a.id > b.id;
  });
  return all;
}

std::string BatchStore::new_id() { return "batch_" + random_hex(24); }

bool BatchStore::valid_id(const std::string& id) {
  if (id.size() != 6 + 24 || id.rfind("batch_", 0) != 0) return false;
  return std::all_of(id.begin() + 6, id.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace tandem::launcher
