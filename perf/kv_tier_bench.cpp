// The KV tiers' data paths against plain copies of the same bytes, in one run:
//   offload  G1 -> G2 (eviction into host memory)   vs memcpy
//   onboard  G2 -> G1 (lookup copying blocks back)   vs memcpy
//   store    G1 -> G3 (write-behind to HDF5, until closed and renamed) vs one plain H5Dwrite
//   load     G3 -> G2 -> G1 (read ahead, then onboard)                vs one plain H5Dread
// with the bench model's block (Qwen3-0.6B shape: 28 layers, 8 KV heads of
// 128, 16 tokens, float32 = 3.5 MiB). Before each read the files are synced
// and dropped from the page cache (posix_fadvise), for both sides alike.
// Figures and ratios only; never fails on time.
//   kv_tier_bench [DIR] [BLOCKS] [ROUNDS]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <hdf5.h>

#include "kv/block_pool.h"
#include "kv/tiers.h"

using namespace tandem::kv;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Syncs every file under dir and asks the kernel to drop its cached pages.
bool drop_cache(const fs::path& dir) {
  bool ok = true;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ok = ok && ::fsync(fd) == 0 && ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    ::close(fd);
  }
  return ok;
}

void row(const char* what, double bytes, double ours_s, double base_s, const char* base) {
  const double ours = bytes / ours_s / 1e9, plain = bytes / base_s / 1e9;
  std::printf("  %-34s %7.2f GB/s   %-26s %7.2f GB/s   ratio %.2f\n", what, ours, base, plain, ours / plain);
}

// Plain HDF5 of the same bytes: one contiguous dataset, one write, one read.
double plain_write(const fs::path& file, const KvLayout& layout, int64_t n, const float* data) {
  const auto t0 = Clock::now();
  const hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t dims[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(layout.block_floats())};
  const hid_t space = H5Screate_simple(2, dims, nullptr);
  const hid_t set = H5Dcreate2(f, "kv", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(set);
  H5Sclose(space);
  H5Fclose(f);
  return seconds_since(t0);
}

double plain_read(const fs::path& file, float* out) {
  const auto t0 = Clock::now();
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t set = H5Dopen2(f, "kv", H5P_DEFAULT);
  H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out);
  H5Dclose(set);
  H5Fclose(f);
  return seconds_since(t0);
}

// The bench's blocks: n of random KV in a pool (`original` keeps a copy), and their hashes.
struct Setup {
  KvLayout layout{28, 8, 128, 16};
  int64_t n = 0;
  double bytes = 0;
  std::vector<float> original;
  std::vector<uint64_t> hashes;  // block i's
};

// Offload and onboard between the pool and host memory of exactly n blocks.
// Its pages are faulted in as it first fills (timed apart); later evictions
// reuse them, as in a long job.
void bench_host(const Setup& b, std::vector<std::string>& warnings) {
  BlockPool pool(b.layout, b.n);
  auto blocks = *pool.allocate(b.n);
  std::vector<float> scratch(b.original.size());
  std::memcpy(pool.data(), b.original.data(), static_cast<std::size_t>(b.bytes));  // both sides' pages in place
  auto t0 = Clock::now();
  std::memcpy(scratch.data(), pool.data(), static_cast<std::size_t>(b.bytes));
  const double memcpy_out = seconds_since(t0);
  t0 = Clock::now();
  std::memcpy(pool.data(), scratch.data(), static_cast<std::size_t>(b.bytes));
  const double memcpy_in = seconds_since(t0);
  auto publish_all = [&](uint64_t base) {
    for (int64_t i = 0; i < b.n; ++i) pool.publish(blocks[static_cast<std::size_t>(i)], base + static_cast<uint64_t>(i));
  };
  TierOptions h;
  h.host_bytes = static_cast<int64_t>(b.bytes);
  KvTiers host(b.layout, h, warnings);
  pool.set_lower(&host);
  publish_all(0x900000);
  pool.release(blocks);
  t0 = Clock::now();
  auto fresh = *pool.allocate(b.n);  // evicts every cached block into host memory
  const double first_fill_s = seconds_since(t0);
  pool.release(fresh);
  blocks = *pool.allocate(b.n);
  std::memcpy(pool.data(), b.original.data(), static_cast<std::size_t>(b.bytes));
  publish_all(0x1000);
  pool.release(blocks);
  t0 = Clock::now();
  fresh = *pool.allocate(b.n);
  const double offload_s = seconds_since(t0);
  pool.release(fresh);
  t0 = Clock::now();
  auto back = pool.lookup(b.hashes);  // copies them back
  const double onboard_s = seconds_since(t0);
  const auto st = host.stats();
  std::printf("offload/onboard between the pool and host memory (%lld offloaded, %lld onboarded):\n",
              static_cast<long long>(st.host_offloaded), static_cast<long long>(st.host_onboarded));
  row("offload G1 -> G2 (first fill)", b.bytes, first_fill_s, memcpy_out, "memcpy");
  row("offload G1 -> G2 (evict)", b.bytes, offload_s, memcpy_out, "memcpy");
  row("onboard G2 -> G1 (lookup)", b.bytes, onboard_s, memcpy_in, "memcpy");
  pool.release(back);
  pool.set_lower(nullptr);
}

// A fresh store written from `src`'s blocks (write-behind, until closed).
// Returns the seconds the step loop spent queueing them and the whole write.
std::pair<double, double> store_write(const Setup& b, const TierOptions& o, BlockPool& src,
                                      const std::vector<int32_t>& blocks, std::vector<std::string>& warnings) {
  KvTiers tiers(b.layout, o, warnings);
  src.set_lower(&tiers);
  // Publishing a block counts one use: with min_hits = 1 each goes to the write-behind queue.
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < b.n; ++i) src.publish(blocks[static_cast<std::size_t>(i)], b.hashes[static_cast<std::size_t>(i)]);
  const double queued = seconds_since(t0);
  tiers.close(warnings);
  const double written = seconds_since(t0);
  src.set_lower(nullptr);
  return {queued, written};
}

// A later job opens the store, reads every block ahead into host memory,
// then onboards them; each block is checked against what was stored (hash i
// was block stored_in[i]). Returns the read-ahead and the whole load's
// seconds, and whether every block came back bit-identical.
std::tuple<double, double, bool> store_load(const Setup& b, const TierOptions& o, const std::vector<int32_t>& stored_in,
                                            std::vector<std::string>& warnings) {
  BlockPool later(b.layout, b.n);
  const auto t0 = Clock::now();
  KvTiers tiers(b.layout, o, warnings);
  later.set_lower(&tiers);
  std::vector<std::string> w;
  tiers.prefetch(b.hashes, later);
  while (tiers.reading_any()) {
    tiers.poll(w);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double read_s = seconds_since(t0);
  auto got = later.lookup(b.hashes);
  const double load_s = seconds_since(t0);
  bool same = got.size() == static_cast<std::size_t>(b.n);
  const auto floats = b.layout.block_floats();
  for (std::size_t i = 0; same && i < got.size(); ++i)
    same = std::memcmp(later.data() + got[i] * floats, b.original.data() + stored_in[i] * floats,
                       b.layout.block_bytes()) == 0;
  later.release(got);
  later.set_lower(nullptr);
  tiers.close(w);
  return {read_s, load_s, same};
}

// The store, in rounds (this machine's disk varies several-fold from one
// minute to the next): each round writes a fresh store and a plain file,
// drops both from the page cache, reads both back. Medians are printed.
void bench_store(const Setup& b, const fs::path& dir, int rounds, std::vector<std::string>& warnings) {
  BlockPool src(b.layout, b.n);
  auto blocks = *src.allocate(b.n);
  std::memcpy(src.data(), b.original.data(), static_cast<std::size_t>(b.bytes));
  TierOptions o;
  o.store_min_hits = 1;
  o.max_queued_bytes = static_cast<int64_t>(b.bytes) * 2;
  o.host_bytes = static_cast<int64_t>(b.bytes) * 2;  // room to read the whole store ahead
  o.store.id = {"bench", "kv_tier_bench", b.layout};
  std::vector<double> store_s, plain_write_s, read_s, load_s, plain_read_s, queue_s;
  std::vector<float> scratch(b.original.size());
  bool same = true, dropped = true;
  for (int round = 0; round < rounds; ++round) {
    o.store.dir = dir / ("store" + std::to_string(round));
    const auto [queued, written] = store_write(b, o, src, blocks, warnings);
    queue_s.push_back(queued);
    store_s.push_back(written);
    const fs::path plain = dir / ("plain" + std::to_string(round) + ".h5");
    plain_write_s.push_back(plain_write(plain, b.layout, b.n, b.original.data()));
    dropped = drop_cache(dir) && dropped;
    plain_read_s.push_back(plain_read(plain, scratch.data()));
    const auto [read, load, ok] = store_load(b, o, blocks, warnings);
    read_s.push_back(read);
    load_s.push_back(load);
    same = same && ok;
    src.release(blocks);
    blocks = *src.allocate(b.n);  // the same bytes, unpublished, for the next round's store
  }
  std::printf("the HDF5 store against plain HDF5 of the same bytes (median of %d rounds):\n", rounds);
  std::printf("  (the step loop spent %.1f ms queueing %lld blocks for the store: %.2f GB/s of copies)\n",
              median(queue_s) * 1e3, static_cast<long long>(b.n), b.bytes / median(queue_s) / 1e9);
  row("store G1 -> G3 (write-behind)", b.bytes, median(store_s), median(plain_write_s), "one H5Dwrite");
  row("load G3 -> G2 (open + read ahead)", b.bytes, median(read_s), median(plain_read_s), "one H5Dread");
  row("load G3 -> G1 (+ onboard)", b.bytes, median(load_s), median(plain_read_s), "one H5Dread");
  std::printf("  every block back bit-identical in every round: %s; page cache dropped before reads: %s\n",
              same ? "yes" : "NO", dropped ? "yes" : "no (fadvise refused: reads may come from memory)");
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir = argc > 1 ? fs::path(argv[1]) : fs::temp_directory_path() / "tandem-kv-tier-bench";
  Setup b;
  b.n = argc > 2 ? std::stoll(argv[2]) : 96;
  const int rounds = argc > 3 ? std::stoi(argv[3]) : 5;
  const auto block = static_cast<double>(b.layout.block_bytes());
  b.bytes = block * static_cast<double>(b.n);
  fs::remove_all(dir);
  fs::create_directories(dir / "store");
  std::printf("kv_tier_bench: %lld blocks of %.2f MiB (%.0f MiB), store in %s\n", static_cast<long long>(b.n),
              block / (1 << 20), b.bytes / (1 << 20), dir.c_str());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  b.original.resize(static_cast<std::size_t>(b.n * b.layout.block_floats()));
  for (auto& x : b.original) x = u(rng);
  for (int64_t i = 0; i < b.n; ++i) b.hashes.push_back(0x1000 + static_cast<uint64_t>(i));
  std::vector<std::string> warnings;
  bench_host(b, warnings);
  bench_store(b, dir, rounds, warnings);
  for (const auto& x : warnings) std::printf("  warning: %s\n", x.c_str());
  fs::remove_all(dir);
  return 0;
}
