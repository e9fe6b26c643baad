// How rank 0 names an input line in the checkpoint, the same way in the
// resume check (router/input_scan.h) and in the job that writes it
// (router/loop/batch_frontend.cpp): its custom_id the first time the id
// appears, else its line number; with it, the hash of the line's text, so
// a resume can tell that a done line is still the same line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/u64_set.h"
#include "slurm/resumable_output.h"

namespace tandem::router {

// The custom_id a line is keyed by: the value of its first top-level
// "custom_id" key when that is a string, read as far as the line is valid
// JSON (a line that breaks after its custom_id keeps it); else "". Reads
// only up to that key, so it is cheap where custom_id comes first.
std::string line_key_id(std::string_view text);

// The hash of a line as read (`text`: the whole line, or its first
// InputFile::kKeptPrefix bytes when it is longer; `length`: its length).
uint64_t line_text_hash(std::string_view text, uint64_t length);

// Whether a line carries no request: blank (spaces, tabs, CR) and not too long.
bool blank_line(std::string_view text, bool too_long);

// Keys lines in input order. Ids are remembered by their 64-bit hash (10-15
// bytes a line, common/u64_set.h): a line whose id's hash an earlier line's
// id had is treated as a duplicate and keyed by its line number, so every
// id key stands for one hash and the checkpoint's hashes are exact.
class LineKeys {
 public:
  // The key of line i (0-based) with key id `id` and text hash `hash`.
  slurm::OutputKey key(uint64_t i, const std::string& id, uint64_t hash) {
    if (!id.empty() && seen_.insert(slurm::custom_id_hash(id))) return slurm::OutputKey::id(id, hash);
    return slurm::OutputKey::of_line(i + 1, hash);
  }
  // For an input of n lines known ahead (router/input_scan.h): the table is sized once, never grown.
  void reserve(std::size_t n) { seen_.reserve(n); }
  std::size_t memory_bytes() const { return seen_.memory_bytes(); }

 private:
  U64Set seen_;
};

}  // namespace tandem::router
