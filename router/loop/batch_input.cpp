#include "router/loop/batch_input.h"

#include <utility>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "kv/block_hash.h"
#include "router/line_key.h"

namespace tandem::router {

BatchInput::BatchInput(Options o, std::shared_ptr<const InputScan> scan, InputShard shard)
    : o_(std::move(o)), in_(o_.path, o_.max_line_bytes), scan_(std::move(scan)), shard_(shard) {
  pool_.emplace(std::max(0, o_.tokenize_threads), [this](PreparedLine& p) { prepare(p); });
}

bool BatchInput::read_line(Line& l) {
  if (!error_.empty()) return false;
  try {
    const auto got = in_.next(l.text, l.length);
    l.too_long = got == InputFile::Got::kTooLong;
    return got != InputFile::Got::kEnd;
  } catch (const Error& e) {
    error_ = e.what();
    spdlog::error("{}", error_);
    return false;
  }
}

// A line an earlier run answered (scan_) is neither parsed nor tokenized
// again; its key is still settled on the main thread, in order.
void BatchInput::prepare(PreparedLine& p) const {
  if (blank_line(p.line.text, p.line.too_long) || !shard_.has(p.i)) {
    p.skip = true;
    return;
  }
  p.key_id = line_key_id(p.line.text);
  p.text_hash = line_text_hash(p.line.text, p.line.length);
  if (scan_ && scan_->done(p.i)) {
    p.done = true;
    return;
  }
  p.parsed = parse_batch_line(p.line.text, 16, o_.defaults);
  // (the text is freed on the main thread, which allocated it)
  auto* req = std::get_if<BatchRequest>(&p.parsed);
  if (!req || p.line.too_long) return;
  p.prompt = build_prompt(*req, *o_.prompts);
  const auto* ids = std::get_if<std::vector<int32_t>>(&*p.prompt);
  if (ids && o_.hash_blocks) p.hashes = kv::full_block_hashes(*ids, o_.block_size);
}

// Keeps the pool fed: lines read ahead up to a depth per helper and 64 MiB
// of text (a line is at most job.max_line_bytes).
void BatchInput::fill_pool() {
  const std::size_t depth = pool_->threads() == 0 ? 1 : static_cast<std::size_t>(64 * pool_->threads());
  constexpr std::size_t kMaxBytes = std::size_t{64} << 20;
  while (!reading_done_ && pool_->size() < depth && (pool_->size() == 0 || pool_bytes_ < kMaxBytes)) {
    PreparedLine p;
    if (!read_line(p.line)) {
      reading_done_ = true;
      break;
    }
    p.i = read_index_++;
    p.bytes = p.line.text.size();
    pool_bytes_ += p.bytes;
    pool_->push(std::move(p));
  }
}

PreparedLine BatchInput::pop() {
  PreparedLine p = pool_->pop();
  pool_bytes_ -= p.bytes;
  return p;
}

bool BatchInput::next(PreparedLine& p) {
  if (!ahead_.empty()) {
    p = std::move(ahead_.front());
    ahead_.pop_front();
    return true;
  }
  fill_pool();
  if (pool_->size() == 0) return false;
  p = pop();
  fill_pool();
  return true;
}

const std::deque<PreparedLine>& BatchInput::read_ahead(int64_t n, const std::function<bool()>& stop) {
  while (static_cast<int64_t>(ahead_.size()) < n) {
    if (stop()) break;  // the lines read stay unplaced: not written, done on --resume
    fill_pool();
    if (pool_->size() == 0) break;
    ahead_.push_back(pop());
  }
  return ahead_;
}

}  // namespace tandem::router
