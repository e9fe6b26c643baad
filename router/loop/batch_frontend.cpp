#include "router/loop/batch_frontend.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <variant>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/ordered_pool.h"
#include "common/u64_set.h"
#include "kv/block_hash.h"
#include "router/batch_request.h"
#include "router/input_file.h"
#include "router/job_stats.h"
#include "router/line_key.h"
#include "router/loop/router_loop.h"
#include "router/prefix_order.h"
#include "slurm/resumable_output.h"

namespace tandem::router {
namespace {

using Clock = std::chrono::steady_clock;

// Hands lines to the resumable output, in completion order or in input order
// through a reorder buffer; commits (fsync + checkpoint) at least every
// flush_seconds.
class OutputWriter {
 public:
  OutputWriter(slurm::ResumableOutput& out, bool input_order, double flush_seconds)
      : out_(out), input_order_(input_order), flush_seconds_(flush_seconds) {}
  void put(uint64_t index, slurm::OutputKey key, std::string line) {
    if (!input_order_) return out_.write(key, line);
    buffer_.emplace(index, std::make_pair(std::move(key), std::move(line)));
    while (!buffer_.empty() && buffer_.begin()->first == next_) {
      if (!buffer_.begin()->second.second.empty()) out_.write(buffer_.begin()->second.first, buffer_.begin()->second.second);
      buffer_.erase(buffer_.begin());
      ++next_;
    }
  }
  // Input order: an index that produces no line (a blank or an already-done line) must still advance the order.
  void skip(uint64_t index) {
    if (input_order_) put(index, slurm::OutputKey(), std::string());
  }
  std::size_t buffered() const { return buffer_.size(); }
  void commit() {
    out_.commit();
    last_commit_ = Clock::now();
  }
  // Every flush_seconds; every second while draining (the job may be killed any moment).
  void maybe_commit(bool draining) {
    const double every = draining ? std::min(flush_seconds_, 1.0) : flush_seconds_;
    if (std::chrono::duration<double>(Clock::now() - last_commit_).count() >= every) commit();
  }

 private:
  slurm::ResumableOutput& out_;
  bool input_order_;
  double flush_seconds_;
  std::map<uint64_t, std::pair<slurm::OutputKey, std::string>> buffer_;
  uint64_t next_ = 0;
  Clock::time_point last_commit_ = Clock::now();
};

// An input line as read: its text (only the first InputFile::kKeptPrefix
// bytes when too long) and its length.
struct Line {
  std::string text;
  uint64_t length = 0;
  bool too_long = false;
};

// An input line prepared off the main thread (OrderedPool): parsed, its
// prompt built (tokenized) and its blocks hashed, unless it is blank, another
// array task's, or a request an earlier run finished (resume).
struct Prepared {
  uint64_t i = 0;
  Line line;  // its text is dropped once parsed
  std::size_t bytes = 0;
  bool skip = false;  // blank, or another shard's
  bool done = false;  // answered by an earlier run (resume): not parsed
  std::string key_id;      // line_key_id of its text
  uint64_t text_hash = 0;  // line_text_hash of its text
  ParsedLine parsed;
  std::optional<std::variant<std::vector<int32_t>, LineError>> prompt;
  std::vector<uint64_t> hashes;  // the prompt's full blocks, when reordering
};

class BatchFrontend : public Frontend {
 public:
  explicit BatchFrontend(const BatchSetup& s);
  void workers_loaded(std::size_t loaded, std::size_t want) override;
  void admit(RouterLoop& loop) override;
  void on_result(service::WireResult& r) override;
  void on_stats(const service::RankReport& r) override {
    if (s_.planner) s_.planner->observe(r.step_samples, r.tp);
  }
  void tick(RouterLoop& loop) override;
  bool exhausted() const override { return input_done_ && window_.empty(); }
  void drain_started(int signal, std::size_t in_flight) override;
  void ended(std::vector<service::RankReport> reports, std::size_t abandoned) override;
  void commit_now() override { out_.commit(); }
  nlohmann::json summary() const { return summary_; }

 private:
  struct InFlight {
    slurm::OutputKey key;
    BatchRequest request;
    std::vector<int32_t> prompt;
    int prefill = -1;  // prefill rank, or -1 when prefilled on its worker
  };
  // Built and waiting to be placed (the reorder window).
  struct Ready {
    uint64_t i;
    InFlight f;
    service::WireRequest w;
    std::vector<uint64_t> hashes;  // the prompt's full blocks, when reordering
  };
  struct EpochClock {
    Clock::time_point first, last;
    int64_t open = 0;
    bool started = false;
  };

  bool next_line(Line& l);
  void prepare(Prepared& p) const;
  void fill_pool();
  bool next_prepared(Prepared& p);
  void plan_epoch(RouterLoop& loop);
  void read_one(RouterLoop& loop);
  void fail(uint64_t i, slurm::OutputKey key, const LineError& e);
  void progress(bool final);
  bool in_my_shard(uint64_t i) const { return static_cast<int64_t>(i % static_cast<uint64_t>(shard_count_)) == shard_index_; }
  int64_t epoch_of(uint64_t i) const {
    return static_cast<int64_t>(i / static_cast<uint64_t>(std::max<int64_t>(1, s_.epoch_requests)));
  }

  const BatchSetup& s_;
  InputFile in_;
  // A read error or bad compressed data ends the input where it is: what was
  // read is finished and committed, then the job reports the error (the
  // summary's input_error) and fails.
  std::string input_error_;
  std::shared_ptr<const InputScan> scan_;  // which lines are done (resume); null: none
  slurm::ResumableOutput file_;
  OutputWriter out_;
  int64_t shard_index_ = 0, shard_count_ = 1;
  JobStats stats_;
  int64_t resumed_ = 0;
  Clock::time_point start_ = Clock::now(), last_progress_ = start_;
  const bool tty_ = ::isatty(STDERR_FILENO);
  bool loaded_ = false;
  LineKeys keys_;  // each line's checkpoint key, in input order
  std::unordered_map<uint64_t, InFlight> in_flight_;
  uint64_t index_ = 0;  // the next input line to admit
  bool input_done_ = false;
  int64_t lines_read_ = 0;
  uint64_t read_index_ = 0;  // the next input line to read
  bool reading_done_ = false;
  std::size_t pool_bytes_ = 0;  // of the lines in the pool
  std::deque<Prepared> ahead_;  // an epoch's lines read ahead for the planner
  std::map<int64_t, EpochClock> epoch_clock_;
  std::map<int64_t, int64_t> planned_epoch_;  // input epoch -> the planner's (they differ once a resumed epoch had nothing left)
  const int64_t window_size_;
  std::deque<Ready> window_;
  std::vector<uint64_t> last_placed_;
  bool stopping_ = false;
  int stop_signal_ = 0;  // the signal that started the drain (a later one may follow: Slurm's TERM, then the script's USR1)
  nlohmann::json summary_;
  std::optional<OrderedPool<Prepared>> pool_;  // last: its helpers read the members above
};

// The input's share for this job: the one its output records, when it records one.
slurm::OutputShard share_of(const BatchSetup& s) {
  const slurm::OutputShard now{s.array_task, s.shard_index, s.shard_count};
  const auto recorded = s.resume ? slurm::recorded_shard(s.output) : std::nullopt;
  return recorded ? slurm::continue_shard(*recorded, now, s.output) : now;
}

std::shared_ptr<const InputScan> scan_of(const BatchSetup& s) {
  if (s.scanned) return s.scan;
  const slurm::OutputShard share = share_of(s);
  return InputScan::run({s.input, s.output, s.max_line_bytes, s.resume, share.index, share.count});
}

BatchFrontend::BatchFrontend(const BatchSetup& s)
    : s_(s), in_(s.input, s.max_line_bytes), scan_(scan_of(s)), file_(s.output, s.resume),
      out_(file_, s.input_order, s.flush_seconds), window_size_(std::max<int64_t>(1, s.reorder_window)) {
  if (scan_) {
    if (const std::string why = scan_->changed(); !why.empty()) throw Error(why);
    keys_.reserve(static_cast<std::size_t>(scan_->requests()));
  }
  if (s.resume && scan_ && scan_->answered() > 0)
    spdlog::info("resuming {}: {} of {} line(s) already done", s.output, scan_->answered(), scan_->requests());
  else if (s.resume)
    spdlog::info("resuming {}: 0 line(s) already done (nothing committed yet)", s.output);
  stats_.set_hosts(s.hosts);
  // An array task's share of the input is recorded with its output. One task
  // resubmitted alone (--array=2: a one-task array) keeps the share it had;
  // any other change of sharding would take lines that are another task's.
  // (Rank 0 checked this before any work; here it is applied.)
  const slurm::OutputShard now{s.array_task, s.shard_index, s.shard_count};
  const slurm::OutputShard shard = file_.recorded_shard() ? slurm::continue_shard(*file_.recorded_shard(), now, s.output) : now;
  if (shard.count != now.count)
    spdlog::info("array task {} alone: it keeps its share of the input, shard {} of {}, as its output records",
                 shard.task, shard.index + 1, shard.count);
  // Recorded first thing in a new checkpoint (one from before this record existed stays without).
  if (!file_.recorded_shard() && s.array_task >= 0 && file_.committed_bytes() == 0) file_.record_shard(now);
  shard_index_ = shard.index;
  shard_count_ = shard.count;
  pool_.emplace(std::max(0, s.tokenize_threads), [this](Prepared& p) { prepare(p); });
}

// Workers load the model while rank 0 starts: nothing is placed before every
// one of them has, so the job's clock (elapsed_s, TTFT, epochs) measures the
// work, not the loading.
void BatchFrontend::workers_loaded(std::size_t loaded, std::size_t want) {
  if (loaded_ || loaded < want) return;
  loaded_ = true;
  spdlog::info("{} worker(s) loaded in {:.1f} s", want, std::chrono::duration<double>(Clock::now() - start_).count());
  start_ = last_progress_ = Clock::now();
}

bool BatchFrontend::next_line(Line& l) {
  if (!input_error_.empty()) return false;
  try {
    const auto got = in_.next(l.text, l.length);
    l.too_long = got == InputFile::Got::kTooLong;
    return got != InputFile::Got::kEnd;
  } catch (const Error& e) {
    input_error_ = e.what();
    spdlog::error("{}", input_error_);
    return false;
  }
}

// On a helper thread: everything about a line that needs none of the main
// thread's state. A line an earlier run answered (scan_) is neither parsed
// nor tokenized again; its key is still settled on the main thread, in order.
void BatchFrontend::prepare(Prepared& p) const {
  if (blank_line(p.line.text, p.line.too_long) || !in_my_shard(p.i)) {
    p.skip = true;
    return;
  }
  p.key_id = line_key_id(p.line.text);
  p.text_hash = line_text_hash(p.line.text, p.line.length);
  if (scan_ && scan_->done(p.i)) {
    p.done = true;
    return;
  }
  p.parsed = parse_batch_line(p.line.text);
  // (the text is freed on the main thread, which allocated it)
  auto* req = std::get_if<BatchRequest>(&p.parsed);
  if (!req || p.line.too_long) return;
  p.prompt = build_prompt(*req, s_.prompts);
  const auto* ids = std::get_if<std::vector<int32_t>>(&*p.prompt);
  if (ids && window_size_ > 1) p.hashes = kv::full_block_hashes(*ids, s_.dispatch.block_size);
}

// Keeps the pool fed: lines read ahead up to a depth per helper and 64 MiB
// of text (a line is at most job.max_line_bytes).
void BatchFrontend::fill_pool() {
  const std::size_t depth = pool_->threads() == 0 ? 1 : static_cast<std::size_t>(64 * pool_->threads());
  constexpr std::size_t kMaxBytes = std::size_t{64} << 20;
  while (!reading_done_ && pool_->size() < depth && (pool_->size() == 0 || pool_bytes_ < kMaxBytes)) {
    Prepared p;
    if (!next_line(p.line)) {
      reading_done_ = true;
      break;
    }
    p.i = read_index_++;
    p.bytes = p.line.text.size();
    pool_bytes_ += p.bytes;
    pool_->push(std::move(p));
  }
}

// The next line in input order, prepared; false at the input's end.
bool BatchFrontend::next_prepared(Prepared& p) {
  if (!ahead_.empty()) {
    p = std::move(ahead_.front());
    ahead_.pop_front();
    return true;
  }
  fill_pool();
  if (pool_->size() == 0) return false;
  p = pool_->pop();
  pool_bytes_ -= p.bytes;
  fill_pool();
  return true;
}

// The planner's look-ahead: at the first line of an epoch the whole epoch is
// read and prepared (kept for admission), and the planner chooses the
// epoch's split before any of it is placed.
void BatchFrontend::plan_epoch(RouterLoop& loop) {
  while (static_cast<int64_t>(ahead_.size()) < s_.epoch_requests) {
    if (loop.stop_requested()) return;  // the lines read stay unplaced: not written, done on --resume
    fill_pool();
    if (pool_->size() == 0) break;
    Prepared p = pool_->pop();
    pool_bytes_ -= p.bytes;
    ahead_.push_back(std::move(p));
  }
  std::vector<planner::Request> reqs;
  for (const Prepared& p : ahead_) {
    // Requests with a prompt: neither bad lines nor lines an earlier run wrote (resume).
    const auto* ids = p.prompt ? std::get_if<std::vector<int32_t>>(&*p.prompt) : nullptr;
    if (p.skip || p.done || p.line.too_long || !ids) continue;
    reqs.push_back({.isl = static_cast<int64_t>(ids->size()), .osl = std::get<BatchRequest>(p.parsed).params.max_tokens});
  }
  if (reqs.empty()) return;
  const auto d = s_.planner->decide(reqs);
  planned_epoch_[epoch_of(index_)] = d.epoch;
  if (d.changed()) {
    std::vector<int> prefill(s_.worker_ranks.begin(), s_.worker_ranks.begin() + d.split.prefill);
    loop.set_roles(d.epoch, prefill);
  }
  spdlog::info("{}", d.describe());
}

void BatchFrontend::fail(uint64_t i, slurm::OutputKey key, const LineError& e) {
  out_.put(i, std::move(key), format_error(e, s_.outputs));
  stats_.request_failed();
}

// Takes the next input line: skipped, failed (its error record written), or into the window.
void BatchFrontend::read_one(RouterLoop& loop) {
  if (s_.planner && index_ % static_cast<uint64_t>(s_.epoch_requests) == 0) {
    plan_epoch(loop);
    if (loop.stop_requested()) return;
  }
  Prepared p;
  if (!next_prepared(p)) {
    input_done_ = true;
    return;
  }
  const uint64_t i = p.i;
  index_ = i + 1;
  if (p.skip) {
    out_.skip(i);  // blank lines carry no request; other array tasks take the other shards
    return;
  }
  ++lines_read_;
  slurm::OutputKey key = keys_.key(i, p.key_id, p.text_hash);
  if (p.done) {  // an earlier run answered it (router/input_scan.h matched its key and text)
    ++resumed_;
    out_.skip(i);
    return;
  }
  // A line past job.max_line_bytes was not kept: its error record carries the custom_id if one came first.
  ParsedLine& parsed = p.parsed;
  if (p.line.too_long) {
    auto* bad = std::get_if<LineError>(&parsed);
    parsed = LineError{bad ? bad->custom_id : std::get<BatchRequest>(parsed).custom_id, 400,
                       std::to_string(p.line.length) + " bytes, longer than job.max_line_bytes (" +
                           std::to_string(s_.max_line_bytes) +
                           "); it was skipped unread: shorten it, or raise job.max_line_bytes if a prompt this long "
                           "fits the context"};
  }
  if (auto* e = std::get_if<LineError>(&parsed)) {
    e->message = "line " + std::to_string(i + 1) + ": " + e->message;
    fail(i, std::move(key), *e);
    return;
  }
  auto& req = std::get<BatchRequest>(parsed);
  if (key.is_line()) {
    fail(i, key, {req.custom_id, 400, "line " + std::to_string(i + 1) + ": duplicate custom_id '" + req.custom_id +
                                          "'; every line needs its own"});
    return;
  }
  if (!p.prompt) throw Error("line " + std::to_string(i + 1) + ": internal: its prompt was not prepared");
  if (auto* e = std::get_if<LineError>(&*p.prompt)) {
    e->message = "line " + std::to_string(i + 1) + ": " + e->message;
    fail(i, std::move(key), *e);
    return;
  }
  InFlight f{std::move(key), std::move(req), std::get<std::vector<int32_t>>(std::move(*p.prompt))};
  service::WireRequest w;
  w.id = i;
  w.prompt = f.prompt;
  w.params = f.request.params;
  w.rng_key = sampling_key(f.request.seed_given, f.request.params.seed, s_.job_seed, f.request.custom_id);
  window_.push_back({i, std::move(f), std::move(w), std::move(p.hashes)});
}

// Admits lines while there is room: a window per decode worker (their number
// changes when the planner re-splits), and input order's reorder buffer
// bounded too. Built requests pass through a window (router.reorder_window,
// else one): from it, the one sharing the longest block prefix with the last
// request placed goes next, so requests with a common prefix reach their
// worker together and it is computed once.
void BatchFrontend::admit(RouterLoop& loop) {
  if (!loaded_ || loop.stop_requested()) return;
  auto capacity = [&] { return s_.window_per_worker * static_cast<int64_t>(loop.decode_workers()); };
  const std::size_t reorder_limit = static_cast<std::size_t>(std::max<int64_t>(capacity() * 8, 1024));
  while (static_cast<int64_t>(in_flight_.size()) < capacity() && out_.buffered() < reorder_limit) {
    // An epoch starts only once the last one's requests are all placed.
    while (!input_done_ && static_cast<int64_t>(window_.size()) < window_size_ &&
           !(s_.planner && !window_.empty() && index_ % static_cast<uint64_t>(s_.epoch_requests) == 0) &&
           !loop.stop_requested())
      read_one(loop);
    if (loop.stop_requested()) break;  // back to the loop, which starts the drain
    if (window_.empty() || !loop.may_place()) break;  // the epoch's split may have to regroup workers first
    std::size_t k = 0;
    if (window_size_ > 1) {
      std::vector<std::span<const uint64_t>> prefixes;
      for (const auto& r : window_) prefixes.emplace_back(r.hashes);
      k = next_by_shared_prefix(prefixes, last_placed_);
    }
    Ready r = std::move(window_[k]);
    window_.erase(window_.begin() + static_cast<std::ptrdiff_t>(k));
    r.f.prefill = loop.place(std::move(r.w)).prefill;
    if (s_.planner) {
      EpochClock& c = epoch_clock_[epoch_of(r.i)];
      if (!c.started) c.first = Clock::now(), c.started = true;
      ++c.open;
    }
    last_placed_ = std::move(r.hashes);
    in_flight_.emplace(r.i, std::move(r.f));
  }
}

void BatchFrontend::on_result(service::WireResult& r) {
  auto it = in_flight_.find(r.id);
  if (it == in_flight_.end()) return;
  InFlight& f = it->second;
  if (!r.ok) {
    // The engine names the request by its id (the 0-based line index): the line number alone says it.
    const std::string engine_name = "request " + std::to_string(r.id) + ": ";
    const std::string why = r.error.rfind(engine_name, 0) == 0 ? r.error.substr(engine_name.size()) : r.error;
    fail(r.id, f.key,
         {f.request.custom_id, 400, "line " + std::to_string(r.id + 1) + ": " + why});
  } else {
    RequestResult res = result_of(std::move(f.prompt), std::move(r), f.prefill);
    stats_.request_ok(static_cast<int64_t>(res.prompt_ids.size()), static_cast<int64_t>(res.token_ids.size()),
                      res.ttft_ms, res.itl_ms, res.e2e_ms);
    out_.put(r.id, f.key, format_result(f.request, res, s_.outputs));
  }
  in_flight_.erase(it);
  if (s_.planner) {
    EpochClock& c = epoch_clock_[epoch_of(r.id)];
    c.last = Clock::now();
    if (auto pe = planned_epoch_.find(epoch_of(r.id)); --c.open == 0 && pe != planned_epoch_.end())
      s_.planner->measured(pe->second, std::chrono::duration<double>(c.last - c.first).count());
  }
}

// "N/M done": M counts the lines this run has to answer (resumed ones left
// out), known from the start when the input was read through before any work.
void BatchFrontend::progress(bool final) {
  const double el = std::chrono::duration<double>(Clock::now() - start_).count();
  const int64_t finished = stats_.ok() + stats_.failed();
  const double rps = el > 0 ? static_cast<double>(finished) / el : 0;
  const double tps = el > 0 ? static_cast<double>(stats_.generated_tokens()) / el : 0;
  const bool known = input_done_ || (scan_ && scan_->requests() > 0);
  const int64_t to_do = input_done_ || !known ? lines_read_ - resumed_
                                              : static_cast<int64_t>(scan_->requests() - scan_->answered());
  const std::string total = known ? std::to_string(to_do) : std::to_string(to_do) + "+";
  const double eta = known && rps > 0 ? static_cast<double>(to_do - finished) / rps : -1;
  char line[320];
  std::snprintf(line, sizeof line, "%lld/%s done (%lld failed), %.2f req/s, %.1f output tok/s, ETA %s%s",
                static_cast<long long>(finished), total.c_str(), static_cast<long long>(stats_.failed()), rps, tps,
                eta < 0 ? "?" : (std::to_string(static_cast<long long>(eta)) + " s").c_str(),
                resumed_ > 0 ? (", " + std::to_string(resumed_) + " answered before this run").c_str() : "");
  if (tty_ && !final) std::fprintf(stderr, "\r%s\033[K", line);
  else spdlog::info("progress: {}", line);
}

void BatchFrontend::tick(RouterLoop& loop) {
  out_.maybe_commit(loop.draining());
  if (std::chrono::duration<double>(Clock::now() - last_progress_).count() >= (tty_ ? 0.5 : s_.progress_seconds)) {
    progress(false);
    last_progress_ = Clock::now();
  }
}

void BatchFrontend::drain_started(int signal, std::size_t in_flight) {
  stopping_ = true;
  stop_signal_ = signal;
  out_.commit();  // first: what is written is safe now, whatever kills the job before the drain ends
  spdlog::warn("signal {} received: no new requests; draining {} in flight for up to {:g} s", signal, in_flight,
               s_.drain_seconds);
}

void BatchFrontend::ended(std::vector<service::RankReport> reports, std::size_t abandoned) {
  out_.commit();
  if (stopping_) {
    spdlog::warn("stopped by signal {}: {} request(s) in flight abandoned; every written line is committed; "
                 "rerun with --resume to finish the input", stop_signal_, abandoned);
  }
  if (tty_) std::fprintf(stderr, "\n");
  progress(true);
  for (const auto& r : reports) {
    stats_.add_rank(r);
    if (s_.planner) s_.planner->observe(r.step_samples, r.tp);
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  summary_ = stats_.summary(elapsed);
  summary_["requests_resumed"] = resumed_;
  if (s_.planner) {
    // The profile fitted to every step this job measured: for `tandem simulate --hardware`.
    s_.planner->refit();
    summary_["epochs"] = s_.planner->summary();
    summary_["planner_profile"] = s_.planner->profile_json();
    const std::string profile_path = s_.output + ".profile.toml";
    std::ofstream(profile_path) << s_.planner->profile_toml();
    summary_["planner_profile"]["file"] = profile_path;
  }
  summary_["stopped_by_signal"] = stopping_;
  summary_["requests_abandoned"] = static_cast<int64_t>(abandoned);
  summary_["input_format"] = std::string(InputFile::name(in_.format()));
  // Rank 0's memory does not grow with the input (docs/run.md): its peak, for anyone to check.
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) summary_["router_peak_rss_bytes"] = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  if (!input_error_.empty()) summary_["input_error"] = input_error_;
  std::ofstream sf(s_.summary);
  if (!sf) throw Error(s_.summary + ": cannot write the summary");
  sf << summary_.dump(2) << "\n";
}

}  // namespace

nlohmann::json run_batch(const BatchSetup& setup, WorkerLink& link, const std::atomic<int>* stop_signal) {
  BatchFrontend front(setup);
  LoopOptions o;
  o.drain_seconds = setup.drain_seconds;
  o.abort_grace_seconds = 0;  // what the drain did not finish is abandoned: not written, redone on resume
  o.stop_signal = stop_signal;
  o.worker_timeout_seconds = setup.worker_timeout_seconds;
  o.hosts = setup.hosts;
  RouterLoop loop(link, setup.dispatch, o);
  loop.run(front);
  return front.summary();
}

}  // namespace tandem::router
