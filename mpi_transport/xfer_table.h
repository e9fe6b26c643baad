// A backend's outgoing transfers by id. Few are in flight at a time (a
// worker posts one per KV handoff), so a vector searched from the front
// finds one faster than a hash map, and a released entry stays in its slot,
// buffers and all, for the next post: once warm, posting allocates and moves
// nothing. Iteration visits the live entries (in slot order, not the order
// they were added). T needs a reset() that clears it but keeps its buffers'
// capacity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace tandem::mpi {

template <class T>
class XferTable {
 public:
  static constexpr int64_t kFree = -1;  // the id of a slot kept for reuse (transfer ids are >= 0)
  using Entry = std::pair<int64_t, T>;

  // The live entries of a range of slots.
  template <class It>
  class Live {
   public:
    Live(It at, It end) : at_(at), end_(end) { skip(); }
    auto& operator*() const { return *at_; }
    auto* operator->() const { return &*at_; }
    Live& operator++() {
      ++at_;
      skip();
      return *this;
    }
    bool operator==(const Live& o) const { return at_ == o.at_; }

   private:
    void skip() {
      while (at_ != end_ && at_->first == kFree) ++at_;
    }
    It at_, end_;
  };
  using iterator = Live<typename std::vector<Entry>::iterator>;
  using const_iterator = Live<typename std::vector<Entry>::const_iterator>;

  // A cleared entry for a new id.
  T& add(int64_t id) {
    ++live_;
    for (auto& e : slots_)
      if (e.first == kFree) {
        e.first = id;
        e.second.reset();
        return e.second;
      }
    slots_.emplace_back(id, T{});
    return slots_.back().second;
  }
  iterator find(int64_t id) {
    if (id == kFree) return end();
    for (auto it = slots_.begin(); it != slots_.end(); ++it)
      if (it->first == id) return iterator(it, slots_.end());
    return end();
  }
  // Forgets `id` (nothing when unknown); its slot serves a later add().
  void erase(int64_t id) {
    if (id == kFree) return;
    for (auto& e : slots_)
      if (e.first == id) {
        e.first = kFree;
        --live_;
        return;
      }
  }
  bool empty() const { return live_ == 0; }
  std::size_t size() const { return live_; }
  iterator begin() { return iterator(slots_.begin(), slots_.end()); }
  iterator end() { return iterator(slots_.end(), slots_.end()); }
  const_iterator begin() const { return const_iterator(slots_.begin(), slots_.end()); }
  const_iterator end() const { return const_iterator(slots_.end(), slots_.end()); }

 private:
  std::vector<Entry> slots_;
  std::size_t live_ = 0;
};

}  // namespace tandem::mpi
