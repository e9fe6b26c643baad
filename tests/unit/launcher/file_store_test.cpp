#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "launcher/serve/file_store.h"

using tandem::launcher::FileStore;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("tandem-files-" + std::to_string(::getpid()));
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t entries(const fs::path& dir) {
  return fs::exists(dir) ? static_cast<std::size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator())) : 0;
}

}  // namespace

TEST_CASE("the Files API's store keeps whole files only, by id, across restarts", "[files]") {
  TempDir tmp;
  FileStore store(tmp.path);
  CHECK_FALSE(fs::exists(tmp.path));  // nothing written until the first upload
  CHECK(store.list().empty());

  auto up = store.begin(1000);
  REQUIRE(up->write("{\"a\":1}\n", 8));
  REQUIRE(up->write("{\"b\":2}\n", 8));
  const auto f = up->commit("in.jsonl", "batch");
  up.reset();
  CHECK(FileStore::valid_id(f.id));
  CHECK(f.bytes == 16);
  CHECK(read_all(store.content_path(f.id)) == "{\"a\":1}\n{\"b\":2}\n");
  REQUIRE(store.get(f.id));
  CHECK(store.get(f.id)->filename == "in.jsonl");
  CHECK(entries(tmp.path / "files") == 2);  // the bytes and the record, nothing else

  SECTION("an upload past its limit, or dropped before commit, leaves nothing") {
    auto big = store.begin(10);
    CHECK(big->write("12345", 5));
    CHECK_FALSE(big->write("123456", 6));
    CHECK(big->too_large());
    big.reset();
    auto dropped = store.begin(100);
    CHECK(dropped->write("x", 1));
    dropped.reset();
    CHECK(entries(tmp.path / "files") == 2);
  }
  SECTION("a store opened after a kill removes partial uploads and bytes without a record, keeps whole files") {
    std::ofstream(tmp.path / "files" / ".upload-0123456789abcdef") << "half";
    std::ofstream(tmp.path / "files" / "file-00000000000000000000abcd") << "no record";
    std::ofstream(tmp.path / "files" / "file-00000000000000000000abcd.json.part") << "{";
    for (const char* old : {"file-00000000000000000000abcd", "file-00000000000000000000abcd.json.part"})  // a minute old
      fs::last_write_time(tmp.path / "files" / old, fs::file_time_type::clock::now() - std::chrono::minutes(2));
    FileStore again(tmp.path);
    CHECK(entries(tmp.path / "files") == 2);
    REQUIRE(again.list().size() == 1);
    CHECK(again.list()[0].id == f.id);
  }
  SECTION("another server's upload in progress, and bytes whose record is due any moment, are left alone") {
    auto busy = store.begin(1000);  // holds its temporary file locked
    REQUIRE(busy->write("x", 1));
    std::ofstream(tmp.path / "files" / "file-00000000000000000000abce") << "record due";
    FileStore other(tmp.path);
    CHECK(entries(tmp.path / "files") == 4);
    CHECK(busy->commit("late.jsonl", "batch").bytes == 1);
  }
  SECTION("ids name files only: no path, no other shape") {
    for (const std::string bad : {"../files", "file-../../etc/passwd", "file-0123", "FILE-0123456789abcdef01234567",
                                  "file-0123456789ABCDEF01234567", ""})
      CHECK_FALSE(store.get(bad));
    CHECK_FALSE(store.remove("../" + f.id));
  }
  SECTION("delete removes the file; a second delete finds nothing") {
    CHECK(store.remove(f.id));
    CHECK_FALSE(store.remove(f.id));
    CHECK_FALSE(store.get(f.id));
    CHECK(entries(tmp.path / "files") == 0);
  }
  SECTION("a batch_dir that is a file is refused with one line naming the key") {
    std::ofstream(tmp.path / "plain") << "x";
    fs::create_directories(tmp.path / "plain-dir");
    std::ofstream(tmp.path / "plain-dir" / "files") << "x";
    try {
      FileStore bad(tmp.path / "plain-dir");
      FAIL("accepted a file as the files folder");
    } catch (const tandem::Error& e) {
      CHECK(std::string(e.what()).find("http.batch_dir") != std::string::npos);
    }
  }
}
