// A set of 64-bit keys in one flat array: what rank 0 keeps per input line
// (the custom_ids seen, the lines done) must stay small however long the
// input is. Open addressing with linear probing, at most 80% full, grown by
// half: between 10 and 15 bytes per key once it holds more than a few
// thousand (std::unordered_set<uint64_t> takes about 40). Keys are expected
// to be hashes or otherwise well spread; they are mixed again before use.
// Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem {

class U64Set {
 public:
  // True when `key` was not there before.
  bool insert(uint64_t key) {
    if (key == kEmpty) {
      const bool fresh = !has_empty_key_;
      has_empty_key_ = true;
      size_ += fresh;
      return fresh;
    }
    if ((size_ + 1) * 5 > slots_.size() * 4) grow();
    for (std::size_t i = slot_of(key);; i = i + 1 == slots_.size() ? 0 : i + 1) {
      if (slots_[i] == key) return false;
      if (slots_[i] == kEmpty) {
        slots_[i] = key;
        ++size_;
        return true;
      }
    }
  }
  bool contains(uint64_t key) const {
    if (key == kEmpty) return has_empty_key_;
    if (slots_.empty()) return false;
    for (std::size_t i = slot_of(key);; i = i + 1 == slots_.size() ? 0 : i + 1) {
      if (slots_[i] == key) return true;
      if (slots_[i] == kEmpty) return false;
    }
  }
  // Room for n keys in all, so that inserting them never grows the table
  // (growing holds the old and the new array at once: 25 bytes a key then).
  void reserve(std::size_t n) {
    const std::size_t want = n + n / 4 + 1;  // at most 80% full
    if (want > slots_.size()) rehash(want);
  }
  std::size_t size() const { return size_; }
  std::size_t memory_bytes() const { return slots_.capacity() * sizeof(uint64_t); }

 private:
  static constexpr uint64_t kEmpty = 0;  // a key of 0 is kept aside (has_empty_key_)

  // A slot from the top 32 bits of the key after a multiplicative mix
  // (Lemire's multiply-shift range reduction: any table size below 2^32, no modulo).
  std::size_t slot_of(uint64_t key) const {
    const uint64_t mixed = (key ^ (key >> 29)) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(((mixed >> 32) * static_cast<uint64_t>(slots_.size())) >> 32);
  }
  void grow() { rehash(slots_.empty() ? 64 : slots_.size() + slots_.size() / 2); }
  void rehash(std::size_t n_slots) {
    std::vector<uint64_t> old;
    old.swap(slots_);
    slots_.assign(n_slots, kEmpty);
    size_ = has_empty_key_ ? 1 : 0;
    for (uint64_t k : old)
      if (k != kEmpty) insert(k);
  }

  std::vector<uint64_t> slots_;
  std::size_t size_ = 0;
  bool has_empty_key_ = false;
};

}  // namespace tandem
