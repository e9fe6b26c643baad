#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "launcher/serve/batch_runner.h"
#include "launcher/serve/batch_store.h"
#include "launcher/serve/batches_api.h"
#include "launcher/serve/file_store.h"

using tandem::launcher::BatchRecord;
using tandem::launcher::BatchStore;
using tandem::launcher::completion_window_seconds;
using tandem::launcher::FileStore;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("tandem-batches-" + std::to_string(::getpid()));
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("a batch's completion_window: 24h, or whole s, m, h up to 7 days", "[batches]") {
  CHECK(completion_window_seconds("24h") == 86400);
  CHECK(completion_window_seconds("30m") == 1800);
  CHECK(completion_window_seconds("90s") == 90);
  CHECK(completion_window_seconds("168h") == 7 * 86400);
  for (const char* bad : {"169h", "0h", "024h", "1d", "24", "h", "", "-1h", "1.5h", "24H", "99999999h"})
    CHECK(completion_window_seconds(bad) == -1);
}

TEST_CASE("batch records outlast the store: every field read back, newest first, a torn replacement ignored",
          "[batches]") {
  TempDir tmp;
  BatchRecord a;
  a.id = BatchStore::new_id();
  a.endpoint = "/v1/chat/completions";
  a.input_file_id = "file-0123456789abcdef01234567";
  a.completion_window = "24h";
  a.status = "in_progress";
  a.metadata = {{"project", "x"}};
  a.created_at = 100;
  a.expires_at = 100 + 86400;
  a.times["in_progress_at"] = 101;
  a.counts = {7, 3, 1, 40, 50, 1234};
  BatchRecord b = a;
  b.id = BatchStore::new_id();
  b.created_at = 200;
  b.status = "failed";
  b.errors = nlohmann::json::array({{{"code", "batch_failed"}, {"message", "m"}, {"line", nullptr}, {"param", nullptr}}});
  {
    BatchStore store(tmp.path);
    CHECK_FALSE(fs::exists(tmp.path));  // nothing written before the first batch
    store.save(a);
    store.save(b);
  }
  std::ofstream(tmp.path / "batches" / (a.id + ".json.part")) << "{\"id\": \"torn";  // a kill while replacing it
  std::ofstream(tmp.path / "batches" / "batch_ffffffffffffffffffffffff.json") << "not json";
  fs::create_directories(tmp.path / "batches" / b.id);  // a work folder: failed batches keep theirs
  fs::create_directories(tmp.path / "batches" / "batch_eeeeeeeeeeeeeeeeeeeeeeee");  // no record: swept
  BatchStore again(tmp.path);
  CHECK(fs::exists(tmp.path / "batches" / (a.id + ".json.part")));  // only the folder's holder sweeps
  again.sweep();
  CHECK_FALSE(fs::exists(tmp.path / "batches" / (a.id + ".json.part")));
  CHECK(fs::exists(tmp.path / "batches" / b.id));
  CHECK_FALSE(fs::exists(tmp.path / "batches" / "batch_eeeeeeeeeeeeeeeeeeeeeeee"));
  const auto list = again.list();
  REQUIRE(list.size() == 2);
  CHECK(list[0].id == b.id);  // newest first
  const auto got = again.get(a.id);
  REQUIRE(got);
  CHECK(got->endpoint == a.endpoint);
  CHECK(got->input_file_id == a.input_file_id);
  CHECK(got->metadata == a.metadata);
  CHECK(got->expires_at == a.expires_at);
  CHECK(got->times == a.times);
  CHECK(got->counts.total == 7);
  CHECK(got->counts.completed == 3);
  CHECK(got->counts.failed == 1);
  CHECK(got->counts.input_tokens == 40);
  CHECK(got->counts.output_tokens == 50);
  CHECK(got->counts.committed_bytes == 1234);
  CHECK(got->unfinished());
  CHECK_FALSE(again.get(b.id)->unfinished());
  CHECK(again.get(b.id)->errors == b.errors);
  const auto obj = tandem::launcher::batch_object(*got);
  CHECK(obj["object"] == "batch");
  CHECK(obj["request_counts"] == nlohmann::json{{"total", 7}, {"completed", 3}, {"failed", 1}});
  CHECK(obj["usage"]["total_tokens"] == 90);
  CHECK(obj["completed_at"].is_null());
  CHECK_FALSE(obj.contains("tandem"));  // the committed length stays in the record, not in the API's object
  CHECK(BatchStore::valid_id(a.id));
  CHECK_FALSE(BatchStore::valid_id("batch_../../etc"));
  CHECK_FALSE(again.get("batch_ffffffffffffffffffffffff"));
}

TEST_CASE("a finished batch's files are adopted under fixed ids: finalising again replaces them", "[batches]") {
  TempDir tmp;
  fs::create_directories(tmp.path);
  FileStore files(tmp.path);
  const std::string id = "file-00000000000000000000000a";
  std::ofstream(tmp.path / "out.part") << "one\n";
  CHECK(files.adopt(tmp.path / "out.part", id, "b_output.jsonl", "batch_output").bytes == 4);
  std::ofstream(tmp.path / "out.part") << "one\ntwo\n";
  files.adopt(tmp.path / "out.part", id, "b_output.jsonl", "batch_output");
  REQUIRE(files.list().size() == 1);
  CHECK(files.get(id)->bytes == 8);
  CHECK(files.get(id)->purpose == "batch_output");
  CHECK_FALSE(fs::exists(tmp.path / "out.part"));
}

TEST_CASE("one server runs a batch folder's batches: a second one's create is refused, naming the first", "[batches]") {
  TempDir tmp;
  fs::create_directories(tmp.path);
  std::ofstream(tmp.path / "input.jsonl") << "{\"prompt\": \"hi\"}\n";
  tandem::launcher::BatchStore store_a(tmp.path), store_b(tmp.path);
  FileStore files(tmp.path);
  tandem::router::Inbox inbox_a, inbox_b;
  tandem::launcher::BatchRunner a({}, store_a, files, inbox_a), b({}, store_b, files, inbox_b);
  BatchRecord r;
  r.id = BatchStore::new_id();
  r.status = "validating";
  r.created_at = 1;
  CHECK(a.create(r, tmp.path / "input.jsonl").id == r.id);
  CHECK(fs::exists(tmp.path / "batches" / r.id / "input"));  // the input linked: deleting the file does not stop it
  r.id = BatchStore::new_id();
  try {
    b.create(r, tmp.path / "input.jsonl");
    FAIL("a second server's create went through");
  } catch (const tandem::launcher::BatchRunner::InUse& e) {
    CHECK(std::string(e.what()).find("used by another tandem serve (pid " + std::to_string(::getpid())) != std::string::npos);
  }
  CHECK(a.create(r, tmp.path / "input.jsonl").id == r.id);  // the first goes on
}
