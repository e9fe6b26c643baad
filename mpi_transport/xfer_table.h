// A backend's outgoing transfers by id. Few are in flight at a time (a
// worker posts one per KV handoff), so a vector searched from the newest
// finds one faster than a hash map, and an entry that is released keeps its
// buffers for the next post: once warm, posting allocates nothing. Entries
// stay in the order they were added (progress() advances them oldest first).
// T needs a reset() that clears it but keeps its buffers' capacity.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace tandem::mpi {

template <class T>
class XferTable {
 public:
  using Entry = std::pair<int64_t, T>;
  using iterator = typename std::vector<Entry>::iterator;
  using const_iterator = typename std::vector<Entry>::const_iterator;

  // A cleared entry for a new id.
  T& add(int64_t id) {
    if (spare_.empty()) {
      live_.emplace_back(id, T{});
    } else {
      live_.emplace_back(id, std::move(spare_.back()));
      spare_.pop_back();
      live_.back().second.reset();
    }
    return live_.back().second;
  }
  iterator find(int64_t id) {
    for (auto it = live_.end(); it != live_.begin();)
      if ((--it)->first == id) return it;
    return live_.end();
  }
  // Forgets `id` (nothing when unknown); its buffers serve a later add().
  void erase(int64_t id) {
    auto it = find(id);
    if (it == live_.end()) return;
    if (spare_.size() < kSpares) spare_.push_back(std::move(it->second));
    live_.erase(it);
  }
  bool empty() const { return live_.empty(); }
  std::size_t size() const { return live_.size(); }
  iterator begin() { return live_.begin(); }
  iterator end() { return live_.end(); }
  const_iterator begin() const { return live_.begin(); }
  const_iterator end() const { return live_.end(); }

 private:
  static constexpr std::size_t kSpares = 64;
  std::vector<Entry> live_;
  std::vector<T> spare_;
};

}  // namespace tandem::mpi
