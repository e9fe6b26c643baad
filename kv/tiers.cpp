#include "kv/tiers.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace tandem::kv {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// G2's size in blocks: the configured bytes, and with G3 at least room to
// stage what is read ahead (64 blocks or 256 MiB, whichever is more blocks).
int64_t host_blocks(const KvLayout& l, const TierOptions& o) {
  const auto block = static_cast<int64_t>(l.block_bytes());
  int64_t n = o.host_bytes / block;
  if (!o.store.dir.empty()) n = std::max({n, int64_t{64}, (int64_t{256} << 20) / block});
  return n;
}

}  // namespace

KvTiers::KvTiers(const KvLayout& layout, TierOptions options, std::vector<std::string>& warnings)
    : layout_(layout), o_(std::move(options)), host_(layout.block_floats(), host_blocks(layout, o_)) {
  stats_.host_capacity_blocks = host_.capacity();
  if (o_.store.dir.empty()) return;
  o_.store.id.layout = layout;
  store_ = std::make_unique<DiskStore>(o_.store, warnings);
  stats_.store_enabled = store_->enabled();
  stats_.store_writable = store_->writable();
  if (!store_->enabled()) return;
  initial_index_ = store_->hashes();
  in_store_.insert(initial_index_.begin(), initial_index_.end());
  stats_.store_blocks_at_open = store_->blocks();
  stats_.store_files_at_open = store_->files_read();
  io_ = std::thread([this] { io_loop(); });
}

KvTiers::~KvTiers() {
  std::vector<std::string> ignored;
  close(ignored);
}

const float* KvTiers::host_view(const float* data) {
  if (!o_.pool_copy) return data;
  staging_.resize(static_cast<std::size_t>(layout_.block_floats()));
  o_.pool_copy(staging_.data(), data, layout_.block_bytes(), false);
  return staging_.data();
}

void KvTiers::evicted(uint64_t hash, const float* data, int64_t uses) {
  if (host_.capacity() == 0) return;
  const auto t0 = Clock::now();
  const bool had = host_.contains(hash);
  if (had) {
    host_.put(hash, nullptr, uses, false);  // refreshed, not copied
    return;
  }
  host_.put(hash, host_view(data), uses, false);
  ++stats_.host_offloaded;
  stats_.host_bytes += static_cast<double>(layout_.block_bytes());
  stats_.host_seconds += since(t0);
}

void KvTiers::used(uint64_t hash, const float* data, int64_t uses) {
  if (!reads_used(hash, uses)) return;
  const auto bytes = static_cast<int64_t>(layout_.block_bytes());
  {
    std::lock_guard lk(mu_);
    if (queued_bytes_ + bytes > o_.max_queued_bytes) {
      ++stats_.disk_write_dropped;  // the filesystem is behind: a cache may skip a block, the step loop may not wait
      return;
    }
    // A buffer the I/O thread has finished with, if any: no fresh pages on the step loop.
    std::vector<float> buf;
    if (!spare_.empty()) {
      buf = std::move(spare_.back());
      spare_.pop_back();
    }
    const float* src = host_view(data);
    buf.assign(src, src + layout_.block_floats());
    writes_.push_back({hash, std::move(buf)});
    queued_bytes_ += bytes;
  }
  cv_.notify_one();
  in_store_.insert(hash);
  disk_new_.push_back(hash);
}

std::optional<LowerTier::Found> KvTiers::onboard(uint64_t hash, float* dst) {
  const auto t0 = Clock::now();
  if (!host_.contains(hash)) return std::nullopt;
  const HostCache::Entry* e = nullptr;
  if (o_.pool_copy) {
    staging_.resize(static_cast<std::size_t>(layout_.block_floats()));
    e = host_.get(hash, staging_.data());
    o_.pool_copy(dst, staging_.data(), layout_.block_bytes(), true);
  } else {
    e = host_.get(hash, dst);
  }
  stats_.host_bytes += static_cast<double>(layout_.block_bytes());
  stats_.host_seconds += since(t0);
  ++(e->from_disk ? stats_.disk_onboarded : stats_.host_onboarded);
  return Found{e->from_disk ? Tier::kDisk : Tier::kHost, e->uses};
}

bool KvTiers::prefetch(std::span<const uint64_t> hashes, const BlockPool& pool) {
  if (!store_enabled()) return true;
  bool wait = false, asked = false;
  {
    std::lock_guard lk(mu_);
    for (uint64_t h : hashes) {
      if (pool.contains(h) || host_.contains(h)) continue;
      if (in_flight_.count(h)) {
        wait = true;
        continue;
      }
      if (!in_store_.count(h)) break;
      reads_.push_back(h);
      in_flight_.insert(h);
      wait = asked = true;
    }
  }
  if (asked) cv_.notify_one();
  return !wait;
}

bool KvTiers::reading(std::span<const uint64_t> hashes) const {
  if (in_flight_.empty()) return false;
  return std::any_of(hashes.begin(), hashes.end(), [this](uint64_t h) { return in_flight_.count(h) > 0; });
}

void KvTiers::poll(std::vector<std::string>& warnings) {
  std::vector<Read> done;
  {
    std::lock_guard lk(mu_);
    if (done_.empty() && io_warnings_.empty()) {
      stats_.disk_written = written_;
      return;
    }
    done.swap(done_);
    if (write_stopped_) stats_.store_writable = false;
    for (auto& w : io_warnings_) warnings.push_back(std::move(w));
    io_warnings_.clear();
    stats_.disk_written = written_;
    stats_.disk_write_bytes = write_bytes_;
    stats_.disk_write_seconds = write_seconds_;
  }
  for (auto& r : done) {
    in_flight_.erase(r.hash);
    if (r.data.empty()) {
      in_store_.erase(r.hash);
      ++stats_.disk_read_failed;
      continue;
    }
    ++stats_.disk_read;
    stats_.disk_read_bytes += static_cast<double>(layout_.block_bytes());
    stats_.disk_read_seconds += r.seconds;
    host_.put(r.hash, r.data.data(), o_.store_min_hits, true);
  }
  // Their buffers serve the next reads and writes.
  std::lock_guard lk(mu_);
  for (auto& r : done)
    if (r.data.capacity() && static_cast<int64_t>(spare_.size() * layout_.block_bytes()) < o_.max_queued_bytes)
      spare_.push_back(std::move(r.data));
}

void KvTiers::io_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !reads_.empty() || !writes_.empty(); });
    if (!reads_.empty() && !stop_) {  // reads first: a request waits on them
      const uint64_t h = reads_.front();
      reads_.pop_front();
      std::vector<float> data;
      if (!spare_.empty()) {
        data = std::move(spare_.back());
        spare_.pop_back();
      }
      lk.unlock();
      data.resize(static_cast<std::size_t>(layout_.block_floats()));
      std::string warning;
      const auto t0 = Clock::now();
      if (!store_->read(h, data.data(), warning)) data.clear();
      const double dt = since(t0);
      lk.lock();
      done_.push_back({h, std::move(data), dt});
      if (!warning.empty()) io_warnings_.push_back(std::move(warning));
      continue;
    }
    if (!writes_.empty()) {  // everything queued, as one append
      std::deque<Write> batch;
      batch.swap(writes_);
      lk.unlock();
      std::vector<uint64_t> hashes;
      std::vector<float> data;
      data.reserve(batch.size() * static_cast<std::size_t>(layout_.block_floats()));
      for (auto& w : batch) {
        hashes.push_back(w.hash);
        data.insert(data.end(), w.data.begin(), w.data.end());
      }
      std::string warning;
      const auto t0 = Clock::now();
      const bool ok = store_->write(hashes, data.data(), warning);
      const double dt = since(t0);
      lk.lock();
      queued_bytes_ -= static_cast<int64_t>(batch.size() * layout_.block_bytes());
      for (auto& w : batch)
        if (static_cast<int64_t>(spare_.size() * layout_.block_bytes()) < o_.max_queued_bytes)
          spare_.push_back(std::move(w.data));
      if (!ok) write_stopped_ = true;
      pruned_files_ = store_->pruned_files();
      pruned_bytes_ = static_cast<double>(store_->pruned_bytes());
      if (ok) {
        written_ += static_cast<int64_t>(batch.size());
        write_bytes_ += static_cast<double>(batch.size() * layout_.block_bytes());
        write_seconds_ += dt;
      }
      if (!warning.empty()) io_warnings_.push_back(std::move(warning));
      continue;
    }
    if (stop_) return;
  }
}

void KvTiers::close(std::vector<std::string>& warnings) {
  if (io_.joinable()) {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      reads_.clear();  // nobody waits for them any more
    }
    cv_.notify_one();
    io_.join();
  }
  if (store_) store_->close();
  poll(warnings);
}

void KvTiers::drain_events(std::vector<uint64_t>& host_stored, std::vector<uint64_t>& host_removed,
                           std::vector<uint64_t>& disk_stored) {
  host_.drain_events(host_stored, host_removed);
  disk_stored = std::move(disk_new_);
  disk_new_.clear();
}

TierStats KvTiers::stats() const {
  std::lock_guard lk(mu_);
  TierStats s = stats_;
  s.store_pruned_files = pruned_files_;
  s.store_pruned_bytes = pruned_bytes_;
  s.disk_written = written_;
  s.disk_write_bytes = write_bytes_;
  s.disk_write_seconds = write_seconds_;
  return s;
}

}  // namespace tandem::kv
