#include "router/loop/batch_frontend.h"

#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <variant>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "router/batch_request.h"
#include "router/job_stats.h"
#include "router/loop/batch_input.h"
#include "router/loop/batch_lines.h"
#include "router/loop/epoch_book.h"
#include "router/loop/line_ledger.h"
#include "router/loop/output_writer.h"
#include "router/loop/router_loop.h"
#include "router/prefix_order.h"
#include "slurm/resumable_output.h"

namespace tandem::router {
namespace {

using Clock = std::chrono::steady_clock;

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

// An array task's share of the input is recorded with its output. One task
// resubmitted alone (--array=2: a one-task array) keeps the share it had;
// any other change of sharding would take lines that are another task's.
// (Rank 0 checked this before any work; here it is applied.)
InputShard shard_of(const BatchSetup& s, slurm::ResumableOutput& file) {
  const slurm::OutputShard now{s.array_task, s.shard_index, s.shard_count};
  const slurm::OutputShard shard = file.recorded_shard() ? slurm::continue_shard(*file.recorded_shard(), now, s.output) : now;
  if (shard.count != now.count)
    spdlog::info("array task {} alone: it keeps its share of the input, shard {} of {}, as its output records",
                 shard.task, shard.index + 1, shard.count);
  // Recorded first thing in a new checkpoint (one from before this record existed stays without).
  if (!file.recorded_shard() && s.array_task >= 0 && file.committed_bytes() == 0) file.record_shard(now);
  return {shard.index, shard.count};
}

// The batch file through rank 0's loop. Its concerns live apart: the input
// and its read-ahead (BatchInput), each line's key and what an earlier run
// answered (LineLedger), the planner's epochs (EpochBook), the output's
// order and commits (OutputWriter), the counters and the summary (JobStats);
// this class admits lines into the reorder window, places them and turns
// results into output lines.
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
    LineRequest line;
    int prefill = -1;  // prefill rank, or -1 when prefilled on its worker
  };
  // Built and waiting to be placed (the reorder window).
  struct Ready {
    uint64_t i;
    InFlight f;
    service::WireRequest w;
    std::vector<uint64_t> hashes;  // the prompt's full blocks, when reordering
  };

  void plan_epoch(RouterLoop& loop);
  void read_one(RouterLoop& loop);
  void fail(uint64_t i, slurm::OutputKey key, const LineError& e);
  void progress(bool final);
  void write_progress_file(bool final, int64_t finished, int64_t to_do, bool known, double rps, double tps, double eta,
                           double elapsed);

  const BatchSetup& s_;
  const int64_t window_size_;
  std::shared_ptr<const InputScan> scan_;  // which lines are done (resume); null: none
  slurm::ResumableOutput file_;
  OutputWriter out_;
  LineLedger ledger_;
  EpochBook epochs_;
  JobStats stats_;
  Clock::time_point start_ = Clock::now(), last_progress_ = start_;
  const bool tty_ = ::isatty(STDERR_FILENO);
  bool loaded_ = false;
  bool progress_file_failed_ = false;  // warned once; not tried again
  std::unordered_map<uint64_t, InFlight> in_flight_;
  uint64_t index_ = 0;  // the next input line to admit
  bool input_done_ = false;
  std::deque<Ready> window_;
  std::vector<uint64_t> last_placed_;
  bool stopping_ = false;
  int stop_signal_ = 0;  // the signal that started the drain (a later one may follow: Slurm's TERM, then the script's USR1)
  nlohmann::json summary_;
  BatchInput input_;  // last: its helper threads read the members above
};

BatchFrontend::BatchFrontend(const BatchSetup& s)
    : s_(s), window_size_(std::max<int64_t>(1, s.reorder_window)), scan_(scan_of(s)), file_(s.output, s.resume),
      out_(file_, s.input_order, s.flush_seconds), ledger_(scan_), epochs_(s.planner, s.epoch_requests),
      input_({s.input, s.max_line_bytes, s.tokenize_threads, &s.prompts, s.dispatch.block_size, window_size_ > 1,
              s.defaults.get()},
             scan_,
             shard_of(s, file_)) {
  if (scan_)
    if (const std::string why = scan_->changed(); !why.empty()) throw Error(why);
  if (s.resume && scan_ && scan_->answered() > 0)
    spdlog::info("resuming {}: {} of {} line(s) already done", s.output, scan_->answered(), scan_->requests());
  else if (s.resume)
    spdlog::info("resuming {}: 0 line(s) already done (nothing committed yet)", s.output);
  stats_.set_hosts(s.hosts);
  progress(false);  // the progress file exists ("loading") from the start
}

// Workers load the model while rank 0 starts: nothing is placed before every
// one of them has, so the job's clock (elapsed_s, TTFT, epochs) measures the
// work, not the loading.
void BatchFrontend::workers_loaded(std::size_t loaded, std::size_t want) {
  if (loaded_ || loaded < want) return;
  loaded_ = true;
  spdlog::info("{} worker(s) loaded in {:.1f} s", want, std::chrono::duration<double>(Clock::now() - start_).count());
  start_ = last_progress_ = Clock::now();
  progress(false);  // "running" in the progress file (and a first line in the log)
}

// The planner's look-ahead: at the first line of an epoch the whole epoch is
// read and prepared (kept for admission), and the planner chooses the
// epoch's split before any of it is placed.
void BatchFrontend::plan_epoch(RouterLoop& loop) {
  const auto& ahead = input_.read_ahead(epochs_.size(), [&loop] { return loop.stop_requested(); });
  if (loop.stop_requested()) return;  // the lines read stay unplaced: not written, done on --resume
  std::vector<planner::Request> reqs;
  for (const PreparedLine& p : ahead)  // requests with a prompt: neither bad lines nor lines an earlier run wrote
    if (const auto* ids = p.ids())
      reqs.push_back({.isl = static_cast<int64_t>(ids->size()),
                      .osl = std::get<BatchRequest>(p.parsed).endpoint == Endpoint::kEmbeddings
                                 ? 1  // a prefill alone
                                 : std::get<BatchRequest>(p.parsed).params.max_tokens});
  if (reqs.empty()) return;
  const auto d = s_.planner->decide(reqs);
  epochs_.planned(index_, d.epoch);
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
  if (epochs_.opens(index_)) {
    plan_epoch(loop);
    if (loop.stop_requested()) return;
  }
  PreparedLine p;
  if (!input_.next(p)) {
    input_done_ = true;
    return;
  }
  const uint64_t i = p.i;
  index_ = i + 1;
  if (p.skip) {
    out_.skip(i);  // blank lines carry no request; other array tasks take the other shards
    return;
  }
  slurm::OutputKey key = ledger_.settle(p);
  if (p.done) {  // an earlier run answered it (router/input_scan.h matched its key and text)
    ledger_.answered_before();
    out_.skip(i);
    return;
  }
  auto taken = take_line(p, key, s_.max_line_bytes, s_.pooling);
  if (auto* e = std::get_if<LineError>(&taken)) {
    fail(i, std::move(key), *e);
    return;
  }
  InFlight f{std::move(key), std::get<LineRequest>(std::move(taken))};
  service::WireRequest w = wire_request(f.line, i, s_.pooling, s_.job_seed);
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
           !(epochs_.opens(index_) && !window_.empty()) &&
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
    epochs_.placed(r.i);
    last_placed_ = std::move(r.hashes);
    in_flight_.emplace(r.i, std::move(r.f));
  }
}

void BatchFrontend::on_result(service::WireResult& r) {
  auto it = in_flight_.find(r.id);
  if (it == in_flight_.end()) return;
  InFlight& f = it->second;
  const uint64_t i = r.id;
  const Answer a = answer_line(i, f.line, std::move(r), f.prefill, s_.outputs, s_.pooling, s_.hidden);
  if (a.ok) stats_.request_ok(a.prompt_tokens, a.output_tokens, a.ttft_ms, a.itl_ms, a.e2e_ms);
  else stats_.request_failed();
  out_.put(i, f.key, a.line);
  in_flight_.erase(it);
  epochs_.finished(i);
}

// "N/M done": M counts the lines this run has to answer (resumed ones left
// out), known from the start when the input was read through before any work.
// The same figures go to the progress file, replaced whole (written beside
// it, then renamed) so a reader never sees half of it.
void BatchFrontend::progress(bool final) {
  const double el = std::chrono::duration<double>(Clock::now() - start_).count();
  const int64_t finished = stats_.ok() + stats_.failed();
  const double rps = el > 0 && loaded_ ? static_cast<double>(finished) / el : 0;
  const double tps = el > 0 && loaded_ ? static_cast<double>(stats_.generated_tokens()) / el : 0;
  const auto [to_do, known] = ledger_.to_do(input_done_);
  const std::string total = known ? std::to_string(to_do) : std::to_string(to_do) + "+";
  const double eta = known && rps > 0 ? static_cast<double>(to_do - finished) / rps : -1;
  write_progress_file(final, finished, to_do, known, rps, tps, eta, el);
  if (!loaded_ && !final) return;  // the file says "loading"; the log says when the workers are ready
  char line[320];
  std::snprintf(line, sizeof line, "%lld/%s done (%lld failed), %.2f req/s, %.1f output tok/s, ETA %s%s",
                static_cast<long long>(finished), total.c_str(), static_cast<long long>(stats_.failed()), rps, tps,
                eta < 0 ? "?" : (std::to_string(static_cast<long long>(eta)) + " s").c_str(),
                ledger_.resumed() > 0 ? (", " + std::to_string(ledger_.resumed()) + " answered before this run").c_str()
                                      : "");
  if (tty_ && !final) std::fprintf(stderr, "\r%s\033[K", line);
  else spdlog::info("progress: {}", line);
}

void BatchFrontend::write_progress_file(bool final, int64_t finished, int64_t to_do, bool known, double rps, double tps,
                                        double eta, double elapsed) {
  if (s_.progress_file.empty() || progress_file_failed_) return;
  const nlohmann::json j = {
      {"state", final ? (stopping_ ? "stopped" : "done") : loaded_ ? "running" : "loading"},
      {"output", s_.output},
      {"done", finished},
      {"failed", stats_.failed()},
      {"to_do", known ? nlohmann::json(to_do) : nlohmann::json(nullptr)},
      {"read_so_far", to_do},
      {"answered_before_this_run", ledger_.resumed()},
      {"requests_per_s", rps},
      {"output_tokens_per_s", tps},
      {"eta_s", eta < 0 ? nlohmann::json(nullptr) : nlohmann::json(eta)},
      {"elapsed_s", loaded_ ? elapsed : 0.0},
      {"updated_unix_s", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
      {"pid", static_cast<int64_t>(::getpid())}};
  const std::string tmp = s_.progress_file + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  const std::string text = j.dump() + "\n";
  const bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f && std::fclose(f) != 0) f = nullptr;
  if (!ok || !f || std::rename(tmp.c_str(), s_.progress_file.c_str()) != 0) {
    progress_file_failed_ = true;
    spdlog::warn("{}: cannot write the progress file ({}); the job goes on without it (job.progress_file)",
                 s_.progress_file, std::strerror(errno));
    std::remove(tmp.c_str());
  }
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
  const nlohmann::json planned = s_.planner ? s_.planner->finish(s_.output + ".profile.toml") : nlohmann::json();
  summary_ = stats_.write_batch_summary(s_.summary, elapsed,
                                        {.resumed = ledger_.resumed(),
                                         .stopped_by_signal = stopping_,
                                         .abandoned = static_cast<int64_t>(abandoned),
                                         .input_format = std::string(InputFile::name(input_.format())),
                                         .input_error = input_.error(),
                                         .kernels = s_.kernels,
                                         .planner = s_.planner ? &planned : nullptr});
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
