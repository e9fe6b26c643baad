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

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir = argc > 1 ? fs::path(argv[1]) : fs::temp_directory_path() / "tandem-kv-tier-bench";
  const int64_t n = argc > 2 ? std::stoll(argv[2]) : 96;
  const int rounds = argc > 3 ? std::stoi(argv[3]) : 5;
  const KvLayout layout{28, 8, 128, 16};
  const auto block = static_cast<double>(layout.block_bytes());
  const double bytes = block * static_cast<double>(n);
  fs::remove_all(dir);
  fs::create_directories(dir / "store");
  std::printf("kv_tier_bench: %lld blocks of %.2f MiB (%.0f MiB), store in %s\n", static_cast<long long>(n),
              block / (1 << 20), bytes / (1 << 20), dir.c_str());

  // G1 with n blocks of random KV, published.
  BlockPool pool(layout, n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  auto blocks = *pool.allocate(n);
  for (int64_t i = 0; i < n * layout.block_floats(); ++i) pool.data()[i] = u(rng);
  std::vector<uint64_t> hashes;  // block i's
  for (int64_t i = 0; i < n; ++i) hashes.push_back(0x1000 + static_cast<uint64_t>(i));

  // Baseline copies of the same bytes (and the original, to check what comes back).
  std::vector<float> scratch(static_cast<std::size_t>(n * layout.block_floats()));
  const std::vector<float> original(pool.data(), pool.data() + n * layout.block_floats());
  auto t0 = Clock::now();
  std::memcpy(scratch.data(), pool.data(), static_cast<std::size_t>(bytes));
  const double memcpy_out = seconds_since(t0);
  t0 = Clock::now();
  std::memcpy(pool.data(), scratch.data(), static_cast<std::size_t>(bytes));
  const double memcpy_in = seconds_since(t0);

  std::vector<std::string> warnings;
  auto publish_all = [&](uint64_t base) {
    for (int64_t i = 0; i < n; ++i) pool.publish(blocks[static_cast<std::size_t>(i)], base + static_cast<uint64_t>(i));
  };
  {
    // Host memory of exactly n blocks. Its pages are faulted in as it first
    // fills (timed apart); later evictions reuse them, as in a long job.
    TierOptions h;
    h.host_bytes = static_cast<int64_t>(bytes);
    KvTiers host(layout, h, warnings);
    pool.set_lower(&host);
    publish_all(0x900000);
    pool.release(blocks);
    t0 = Clock::now();
    auto fresh = *pool.allocate(n);  // evicts every cached block into host memory
    const double first_fill_s = seconds_since(t0);
    pool.release(fresh);
    blocks = *pool.allocate(n);
    std::memcpy(pool.data(), original.data(), static_cast<std::size_t>(bytes));
    publish_all(0x1000);
    pool.release(blocks);
    t0 = Clock::now();
    fresh = *pool.allocate(n);
    const double offload_s = seconds_since(t0);
    pool.release(fresh);
    t0 = Clock::now();
    auto back = pool.lookup(hashes);  // copies them back
    const double onboard_s = seconds_since(t0);
    const auto st = host.stats();
    std::printf("offload/onboard between the pool and host memory (%lld offloaded, %lld onboarded):\n",
                static_cast<long long>(st.host_offloaded), static_cast<long long>(st.host_onboarded));
    row("offload G1 -> G2 (first fill)", bytes, first_fill_s, memcpy_out, "memcpy");
    row("offload G1 -> G2 (evict)", bytes, offload_s, memcpy_out, "memcpy");
    row("onboard G2 -> G1 (lookup)", bytes, onboard_s, memcpy_in, "memcpy");
    pool.release(back);
    pool.set_lower(nullptr);
  }
  // The store, in rounds (this machine's disk varies several-fold from one
  // minute to the next): each round writes a fresh store and a plain file,
  // drops both from the page cache, reads both back. Medians are printed.
  BlockPool src(layout, n);
  blocks = *src.allocate(n);
  std::memcpy(src.data(), original.data(), static_cast<std::size_t>(bytes));
  TierOptions o;
  o.store_min_hits = 1;
  o.max_queued_bytes = static_cast<int64_t>(bytes) * 2;
  o.host_bytes = static_cast<int64_t>(bytes) * 2;  // room to read the whole store ahead
  o.store.id = {"bench", "kv_tier_bench", layout};
  std::vector<double> store_s, plain_write_s, read_s, load_s, plain_read_s, queue_s;
  bool same = true, dropped = true;
  for (int round = 0; round < rounds; ++round) {
    o.store.dir = dir / ("store" + std::to_string(round));
    {
      KvTiers tiers(layout, o, warnings);
      src.set_lower(&tiers);
      // Publishing a block counts one use: with min_hits = 1 each goes to the write-behind queue.
      t0 = Clock::now();
      for (int64_t i = 0; i < n; ++i) src.publish(blocks[static_cast<std::size_t>(i)], hashes[static_cast<std::size_t>(i)]);
      queue_s.push_back(seconds_since(t0));
      tiers.close(warnings);
      store_s.push_back(seconds_since(t0));
      src.set_lower(nullptr);
    }
    const auto stored_in = blocks;  // hash i is block stored_in[i]'s bytes
    // Plain HDF5 of the same bytes: one contiguous dataset, one write, one read.
    const fs::path plain = dir / ("plain" + std::to_string(round) + ".h5");
    t0 = Clock::now();
    {
      const hid_t f = H5Fcreate(plain.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
      const hsize_t dims[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(layout.block_floats())};
      const hid_t space = H5Screate_simple(2, dims, nullptr);
      const hid_t set = H5Dcreate2(f, "kv", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, original.data());
      H5Dclose(set);
      H5Sclose(space);
      H5Fclose(f);
    }
    plain_write_s.push_back(seconds_since(t0));
    dropped = drop_cache(dir) && dropped;
    t0 = Clock::now();
    {
      const hid_t f = H5Fopen(plain.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      const hid_t set = H5Dopen2(f, "kv", H5P_DEFAULT);
      H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, scratch.data());
      H5Dclose(set);
      H5Fclose(f);
    }
    plain_read_s.push_back(seconds_since(t0));
    // Load: a later job opens the store, reads every block ahead into host memory, then onboards them.
    BlockPool later(layout, n);
    t0 = Clock::now();
    KvTiers tiers(layout, o, warnings);
    later.set_lower(&tiers);
    std::vector<std::string> w;
    tiers.prefetch(hashes, later);
    while (tiers.reading_any()) {
      tiers.poll(w);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    read_s.push_back(seconds_since(t0));
    auto got = later.lookup(hashes);
    load_s.push_back(seconds_since(t0));
    same = same && got.size() == static_cast<std::size_t>(n);
    for (std::size_t i = 0; same && i < got.size(); ++i)
      same = std::memcmp(later.data() + got[i] * layout.block_floats(),
                         original.data() + stored_in[i] * layout.block_floats(), layout.block_bytes()) == 0;
    later.release(got);
    src.release(blocks);
    blocks = *src.allocate(n);  // the same bytes, unpublished, for the next round's store
    later.set_lower(nullptr);
    tiers.close(w);
  }
  std::printf("the HDF5 store against plain HDF5 of the same bytes (median of %d rounds):\n", rounds);
  std::printf("  (the step loop spent %.1f ms queueing %lld blocks for the store: %.2f GB/s of copies)\n",
              median(queue_s) * 1e3, static_cast<long long>(n), bytes / median(queue_s) / 1e9);
  row("store G1 -> G3 (write-behind)", bytes, median(store_s), median(plain_write_s), "one H5Dwrite");
  row("load G3 -> G2 (open + read ahead)", bytes, median(read_s), median(plain_read_s), "one H5Dread");
  row("load G3 -> G1 (+ onboard)", bytes, median(load_s), median(plain_read_s), "one H5Dread");
  std::printf("  every block back bit-identical in every round: %s; page cache dropped before reads: %s\n",
              same ? "yes" : "NO", dropped ? "yes" : "no (fadvise refused: reads may come from memory)");
  for (const auto& x : warnings) std::printf("  warning: %s\n", x.c_str());
  fs::remove_all(dir);
  return 0;
}
