#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <hdf5.h>
#include <unistd.h>

#include "kv/block_pool.h"
#include "kv/disk_store.h"
#include "kv/host_cache.h"
#include "kv/tiers.h"

using namespace tandem::kv;
namespace fs = std::filesystem;

namespace {

const KvLayout kLayout{2, 1, 4, 4};  // 2 layers, 1 KV head of 4, blocks of 4 tokens: 64 floats

std::vector<float> block_of(float v) { return std::vector<float>(static_cast<std::size_t>(kLayout.block_floats()), v); }

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tandem-kv-test-" + std::to_string(getpid()) + "-" +
                                        std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

StoreIdentity identity(std::string fingerprint = "0123456789abcdef") { return {std::move(fingerprint), "test model", kLayout}; }

std::vector<fs::path> store_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".h5") out.push_back(e.path());
  std::sort(out.begin(), out.end());  // names carry time and a per-process sequence: oldest first
  return out;
}

// Fills a pool block with v and publishes it.
int32_t put_block(BlockPool& pool, uint64_t hash, float v) {
  const int32_t b = pool.allocate(1)->front();
  std::fill_n(pool.data() + b * kLayout.block_floats(), kLayout.block_floats(), v);
  pool.publish(b, hash);
  pool.release({b});
  return b;
}

// Waits (briefly) for the I/O thread's reads of `hashes` to land in G2.
void settle(KvTiers& tiers, std::span<const uint64_t> hashes) {
  std::vector<std::string> w;
  for (int i = 0; i < 500 && (tiers.poll(w), tiers.reading(hashes)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

}  // namespace

TEST_CASE("host cache: bounded, LRU, inclusive, copies exact bytes", "[kv]") {
  HostCache c(kLayout.block_floats(), 2);
  auto a = block_of(1), b = block_of(2), d = block_of(3), out = block_of(0);
  c.put(11, a.data(), 1, false);
  c.put(22, b.data(), 3, false);
  REQUIRE(c.get(11, out.data()));  // 11 is now the most recent
  CHECK(out == a);
  c.put(33, d.data(), 1, true);  // full: drops 22, the least recently used
  CHECK(c.contains(11));
  CHECK_FALSE(c.contains(22));
  const auto* e = c.get(33, out.data());
  REQUIRE(e);
  CHECK(e->from_disk);
  CHECK(out == d);
  std::vector<uint64_t> stored, removed;
  c.drain_events(stored, removed);
  CHECK(stored == std::vector<uint64_t>{11, 22, 33});
  CHECK(removed == std::vector<uint64_t>{22});
}

TEST_CASE("pool over a host tier: evicted blocks come back by hash with their bytes", "[kv]") {
  BlockPool pool(kLayout, 2);
  TierOptions o;
  o.host_bytes = 8 * static_cast<int64_t>(kLayout.block_bytes());
  std::vector<std::string> warnings;
  KvTiers tiers(kLayout, o, warnings);
  CHECK(warnings.empty());
  pool.set_lower(&tiers);
  put_block(pool, 101, 1.5f);
  put_block(pool, 102, 2.5f);
  // Two new blocks evict both cached ones into G2.
  auto both = *pool.allocate(2);
  CHECK_FALSE(pool.contains(101));
  CHECK(tiers.stats().host_offloaded == 2);
  pool.release(both);

  const uint64_t want[] = {101, 102, 103};
  std::array<int64_t, kTiers> from{};
  auto got = pool.lookup(want, &from);
  REQUIRE(got.size() == 2);  // 103 is nowhere
  CHECK(from[static_cast<int>(Tier::kHost)] == 2);
  CHECK(from[static_cast<int>(Tier::kDevice)] == 0);
  CHECK(pool.data()[got[0] * kLayout.block_floats()] == 1.5f);
  CHECK(pool.data()[got[1] * kLayout.block_floats() + 63] == 2.5f);
  CHECK(tiers.stats().host_onboarded == 2);
  pool.release(got);
  // Now they are in the pool again: a second lookup hits the device tier.
  from = {};
  pool.release(pool.lookup(want, &from));
  CHECK(from[static_cast<int>(Tier::kDevice)] == 2);
}

TEST_CASE("disk store: blocks written by one process are read back, bit for bit, by the next", "[kv]") {
  TempDir dir;
  std::vector<std::string> warnings;
  {
    DiskStore s({dir.path, identity()}, warnings);
    REQUIRE(s.writable());
    std::vector<float> data;
    for (float v : {1.f, 2.f, 3.f}) {
      auto b = block_of(v);
      data.insert(data.end(), b.begin(), b.end());
    }
    data[64 + 5] = -7.25f;
    const uint64_t hashes[] = {7, 8, 9};
    std::string w;
    REQUIRE(s.write(hashes, data.data(), w));
    CHECK(store_files(dir.path).empty());  // still .part until finished
    auto out = block_of(0);
    REQUIRE(s.read(8, out.data(), w));  // its writer reads it while writing
    CHECK(out[5] == -7.25f);
  }
  CHECK(warnings.empty());
  REQUIRE(store_files(dir.path).size() == 1);
  DiskStore again({dir.path, identity()}, warnings);
  CHECK(warnings.empty());
  CHECK(again.blocks() == 3);
  CHECK(again.files_read() == 1);
  auto out = block_of(0);
  std::string w;
  REQUIRE(again.read(8, out.data(), w));
  CHECK(out[5] == -7.25f);
  CHECK(out[6] == 2.f);
  CHECK_FALSE(again.read(10, out.data(), w));
  CHECK(w.empty());
}

TEST_CASE("disk store: another model's store, a damaged file and a bad directory are one warning each", "[kv]") {
  TempDir dir;
  std::vector<std::string> warnings;
  {
    DiskStore s({dir.path, identity()}, warnings);
    const uint64_t hashes[] = {1, 2};
    std::vector<float> data(128, 4.f);
    std::string w;
    REQUIRE(s.write(hashes, data.data(), w));
  }
  SECTION("another model: not used, not added to") {
    DiskStore other({dir.path, identity("ffffffffffffffff")}, warnings);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("another model") != std::string::npos);
    CHECK(warnings[0].find("the same model's name with another fingerprint") != std::string::npos);  // an upgrade's
    CHECK_FALSE(other.enabled());
    CHECK(other.blocks() == 0);
  }
  SECTION("a truncated file is skipped") {
    const auto f = store_files(dir.path).at(0);
    fs::resize_file(f, fs::file_size(f) / 2);
    DiskStore s({dir.path, identity()}, warnings);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("cannot be read") != std::string::npos);
    CHECK(s.enabled());
    CHECK(s.blocks() == 0);
  }
  SECTION("a flipped byte in a block fails its checksum: a miss, never wrong data") {
    const auto f = store_files(dir.path).at(0);
    DiskStore probe({dir.path, identity()}, warnings);
    REQUIRE(probe.blocks() == 2);
    // Find the block's bytes (the float 4.0 = 00 00 80 40) and change one.
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(io)), {});
    const std::string four("\x00\x00\x80\x40", 4);
    const auto at = bytes.find(four + four + four + four);
    REQUIRE(at != std::string::npos);
    io.seekp(static_cast<std::streamoff>(at + 3));
    io.put('\x41');
    io.close();
    DiskStore s({dir.path, identity()}, warnings);
    auto out = block_of(0);
    std::string w;
    CHECK_FALSE(s.read(1, out.data(), w));
    CHECK(w.find("checksum") != std::string::npos);
    CHECK(s.blocks() == 0);  // the file is dropped
  }
  SECTION("rows whose block hashes were swapped fail their checksum: never KV for another prefix") {
    const auto f = store_files(dir.path).at(0);
    {
      const hid_t file = H5Fopen(f.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      REQUIRE(file >= 0);
      const hid_t set = H5Dopen2(file, "hash", H5P_DEFAULT);
      uint64_t hashes[2] = {0, 0};
      REQUIRE(H5Dread(set, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, hashes) >= 0);
      REQUIRE((hashes[0] == 1 && hashes[1] == 2));
      std::swap(hashes[0], hashes[1]);
      REQUIRE(H5Dwrite(set, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, hashes) >= 0);
      H5Dclose(set);
      H5Fclose(file);
    }
    DiskStore s({dir.path, identity()}, warnings);
    REQUIRE(s.blocks() == 2);  // indexed by the swapped hashes
    auto out = block_of(0);
    std::string w;
    CHECK_FALSE(s.read(1, out.data(), w));
    CHECK(w.find("block hash") != std::string::npos);
    CHECK(s.blocks() == 0);
  }
  SECTION("a path that cannot be a directory") {
    std::ofstream(dir.path / "file") << "x";
    DiskStore s({dir.path / "file" / "store", identity()}, warnings);
    REQUIRE(warnings.size() == 1);
    CHECK_FALSE(s.enabled());
  }
}

TEST_CASE("tiers: blocks used twice reach the store; the next job prefetches them and onboards from disk", "[kv]") {
  TempDir dir;
  TierOptions o;
  o.store.dir = dir.path;
  o.store.id = identity();
  o.store_min_hits = 2;
  std::vector<std::string> warnings;
  {
    BlockPool pool(kLayout, 4);
    KvTiers tiers(kLayout, o, warnings);
    pool.set_lower(&tiers);
    put_block(pool, 501, 5.f);
    put_block(pool, 502, 6.f);
    const uint64_t first[] = {501};
    pool.release(pool.lookup(first));  // 501 used twice: queued for the store; 502 once: not
    tiers.close(warnings);
    CHECK(tiers.stats().disk_written == 1);
  }
  CHECK(warnings.empty());
  BlockPool pool(kLayout, 4);
  KvTiers tiers(kLayout, o, warnings);
  pool.set_lower(&tiers);
  CHECK(tiers.stats().store_blocks_at_open == 1);
  const uint64_t want[] = {501, 502};
  CHECK_FALSE(tiers.prefetch(want, pool));  // 501 is being read
  settle(tiers, want);
  CHECK(tiers.prefetch(want, pool));
  std::array<int64_t, kTiers> from{};
  auto got = pool.lookup(want, &from);
  REQUIRE(got.size() == 1);
  CHECK(from[static_cast<int>(Tier::kDisk)] == 1);
  CHECK(pool.data()[got[0] * kLayout.block_floats()] == 5.f);
  CHECK(tiers.stats().disk_read == 1);
  CHECK(tiers.stats().disk_onboarded == 1);
  pool.release(got);
  tiers.close(warnings);
  CHECK(tiers.stats().disk_written == 0);  // already there: not written twice
  CHECK(warnings.empty());
}

TEST_CASE("disk store past its size limit: least recently used files go first, a read counts as a use", "[kv]") {
  TempDir dir;
  std::vector<std::string> warnings;
  std::vector<float> data(3 * 64, 1.f);
  auto write_job = [&](uint64_t first) {  // one job: one finished file of three blocks
    DiskStore s({dir.path, identity()}, warnings);
    const uint64_t hashes[] = {first, first + 1, first + 2};
    std::string w;
    REQUIRE(s.write(hashes, data.data(), w));
  };
  write_job(100);
  write_job(200);
  auto files = store_files(dir.path);
  REQUIRE(files.size() == 2);
  // Make the first file clearly older, then read one of its blocks: it becomes the newest.
  const auto old_time = fs::file_time_type::clock::now() - std::chrono::hours(2);
  fs::last_write_time(files[0], old_time);
  fs::last_write_time(files[1], old_time + std::chrono::hours(1));
  const int64_t one_file = static_cast<int64_t>(fs::file_size(files[0]));
  {
    DiskStore s({dir.path, identity(), 60, 2 * one_file + 200}, warnings);  // three more blocks (768 bytes) do not fit
    auto out = block_of(0);
    std::string w;
    REQUIRE(s.read(101, out.data(), w));  // touches the first file
    const uint64_t more[] = {300, 301, 302};
    REQUIRE(s.write(more, data.data(), w));  // over the limit: the least recently used (second) file goes
    CHECK(w.empty());
    CHECK(s.pruned_files() == 1);
  }
  CHECK(warnings.empty());
  CHECK(fs::exists(files[0]));
  CHECK_FALSE(fs::exists(files[1]));
  DiskStore after({dir.path, identity()}, warnings);
  CHECK(after.contains(100));
  CHECK_FALSE(after.contains(200));
  CHECK(after.contains(300));
}

TEST_CASE("tiers reach a pool the host cannot read directly only through the pool copy hook", "[kv]") {
  BlockPool pool(kLayout, 2);
  TierOptions o;
  o.host_bytes = 8 * static_cast<int64_t>(kLayout.block_bytes());
  int out = 0, in = 0;
  o.pool_copy = [&](void* dst, const void* src, std::size_t bytes, bool to_pool) {  // stands in for cudaMemcpy
    ++(to_pool ? in : out);
    std::memcpy(dst, src, bytes);
  };
  std::vector<std::string> warnings;
  KvTiers tiers(kLayout, o, warnings);
  pool.set_lower(&tiers);
  put_block(pool, 701, 7.5f);
  pool.release(*pool.allocate(2));  // evicts 701 into host memory: one copy out
  CHECK(out == 1);
  const uint64_t want[] = {701};
  auto got = pool.lookup(want);  // onboards it: one copy in
  REQUIRE(got.size() == 1);
  CHECK(in == 1);
  CHECK(pool.data()[got[0] * kLayout.block_floats() + 5] == 7.5f);
  pool.release(got);
}

TEST_CASE("disk store of bf16 blocks: bits come back as written; a float32 job does not use it", "[kv]") {
  TempDir dir;
  std::vector<std::string> warnings;
  KvLayout bf16 = kLayout;
  bf16.elem_bytes = 2;  // 64 elements in 128 bytes: 32 floats of storage
  REQUIRE(bf16.block_floats() == 32);
  std::vector<uint16_t> bits(2 * 64);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(0x3f80 + i);  // 1.0, 1.0078125, ...
  {
    DiskStore s({dir.path, {"0123456789abcdef", "test model", bf16}}, warnings);
    const uint64_t hashes[] = {21, 22};
    std::string w;
    REQUIRE(s.write(hashes, reinterpret_cast<const float*>(bits.data()), w));
  }
  REQUIRE(warnings.empty());
  DiskStore again({dir.path, {"0123456789abcdef", "test model", bf16}}, warnings);
  REQUIRE(warnings.empty());
  std::vector<uint16_t> out(64);
  std::string w;
  REQUIRE(again.read(22, reinterpret_cast<float*>(out.data()), w));
  CHECK(std::equal(out.begin(), out.end(), bits.begin() + 64));
  DiskStore f32({dir.path, identity()}, warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("bfloat16") != std::string::npos);
  CHECK(warnings[0].find("float32") != std::string::npos);
  CHECK(f32.blocks() == 0);
}

TEST_CASE("an FP8 layout: rows of codes and a scale, blocks of whole floats, a store of its own dtype", "[kv]") {
  KvLayout fp8 = kLayout;
  fp8.elem_bytes = 1;
  REQUIRE(fp8.row_elems() == 8);                                 // head_dim 4 codes, then the scale's 4 bytes
  CHECK(fp8.head_run_bytes() == 4 * 8);                          // a head's run: block_size rows
  CHECK(fp8.block_bytes() == 2 * 2 * 4 * 8);                     // layers x K/V x run
  CHECK(fp8.block_floats() * 4 == static_cast<int64_t>(fp8.block_bytes()));
  CHECK(fp8.offset(1, 1, 1, 0, 3) == fp8.block_elems() + (1 * 2 + 1) * fp8.head_run() + 3 * 8);
  CHECK(fp8.bytes_per_value() == 2.0);                           // 1 + 4 / head_dim at head_dim 4
  TempDir dir;
  std::vector<std::string> warnings;
  std::vector<uint8_t> bytes(fp8.block_bytes() * 2);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  {
    DiskStore s({dir.path, {"0123456789abcdef", "test model", fp8}}, warnings);
    const uint64_t hashes[] = {31, 32};
    std::string w;
    REQUIRE(s.write(hashes, reinterpret_cast<const float*>(bytes.data()), w));
  }
  REQUIRE(warnings.empty());
  DiskStore again({dir.path, {"0123456789abcdef", "test model", fp8}}, warnings);
  REQUIRE(warnings.empty());
  std::vector<uint8_t> out(fp8.block_bytes());
  std::string w;
  REQUIRE(again.read(32, reinterpret_cast<float*>(out.data()), w));
  CHECK(std::equal(out.begin(), out.end(), bytes.begin() + static_cast<std::ptrdiff_t>(fp8.block_bytes())));
  DiskStore f32({dir.path, identity()}, warnings);  // a float32 job: another layout, told how to use it
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("float8_e4m3fn+scale") != std::string::npos);
  CHECK(warnings[0].find("kv.dtype = \"fp8\"") != std::string::npos);
  CHECK(f32.blocks() == 0);
}
