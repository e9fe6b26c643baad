#include "launcher/run/router_loop.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <cstdio>
#include <fstream>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/u64_set.h"
#include "runtime/service/worker_core.h"
#include "kv/block_hash.h"
#include "router/input_file.h"
#include "router/kv_aware_policy.h"
#include "router/prefix_order.h"
#include "slurm/resumable_output.h"

namespace tandem::launcher {

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

struct InFlight {
  router::BatchRequest request;
  std::vector<int32_t> prompt;
  int prefill = -1;  // prefill rank, or -1 when prefilled on its worker
};

}  // namespace

router::DispatchOptions dispatch_options(const RouterSetup& s) {
  router::DispatchOptions o;
  o.block_size = s.block_size;
  o.policy = router::parse_route_policy(s.route_policy);
  o.weights = {1.0, 1.0, s.overlap_weight, s.overlap_weight_host, s.overlap_weight_disk};
  o.local_prefill_tokens = s.local_prefill_tokens;
  o.prefill_saturation_tokens = s.prefill_saturation_tokens;
  return o;
}

nlohmann::json run_router(const RouterSetup& s, router::WorkerLink& link) {
  const Config& cfg = *s.config;
  router::InputFile in(s.input, s.max_line_bytes);
  // A read error or bad compressed data ends the input where it is: what was read is finished and
  // committed, then the job reports the error (the summary's input_error) and fails.
  std::string input_error;
  struct Line {
    std::string text;  // without its newline; only the first InputFile::kKeptPrefix bytes when too_long
    uint64_t length = 0;
    bool too_long = false;
  };
  auto next_line = [&](Line& l) {
    if (!input_error.empty()) return false;
    try {
      const auto got = in.next(l.text, l.length);
      l.too_long = got == router::InputFile::Got::kTooLong;
      return got != router::InputFile::Got::kEnd;
    } catch (const Error& e) {
      input_error = e.what();
      spdlog::error("{}", input_error);
      return false;
    }
  };
  slurm::DoneKeys done;
  slurm::ResumableOutput file(s.output, s.resume, done);
  OutputWriter out(file, cfg.job.output_order == "input", cfg.job.flush_seconds);
  int64_t resumed = 0;
  if (s.resume) spdlog::info("resuming {}: {} line(s) already done", s.output, done.size());
  // An array task's share of the input is recorded with its output. One task
  // resubmitted alone (--array=2: a one-task array) keeps the share it had;
  // any other change of sharding would take lines that are another task's.
  // (Rank 0 checked this before any work; here it is applied.)
  const slurm::OutputShard now{s.array_task, s.shard_index, s.shard_count};
  const slurm::OutputShard shard = file.recorded_shard() ? slurm::continue_shard(*file.recorded_shard(), now, s.output) : now;
  if (shard.count != now.count)
    spdlog::info("array task {} alone: it keeps its share of the input, shard {} of {}, as its output records",
                 shard.task, shard.index + 1, shard.count);
  // Recorded first thing in a new checkpoint (one from before this record existed stays without).
  if (!file.recorded_shard() && s.array_task >= 0 && file.committed_bytes() == 0) file.record_shard(now);
  const int64_t shard_index = shard.index, shard_count = shard.count;
  router::JobStats stats;
  auto start = Clock::now();
  const bool tty = ::isatty(STDERR_FILENO);
  auto last_progress = start;

  U64Set seen_ids;  // hashes of the custom_ids read so far (see key_of)
  std::unordered_map<uint64_t, InFlight> in_flight;
  router::Dispatcher dispatch(link, dispatch_options(s));
  router::LinkEvents events;
  // Workers load the model while rank 0 starts: wait for every one of them, so
  // the job's clock (elapsed_s, TTFT, epochs) measures the work, not the loading.
  {
    std::unordered_set<int> loaded;
    const std::size_t want = link.workers().size() + link.prefill_workers().size();
    while (loaded.size() < want && g_stop_signal.load() == 0) {
      events.clear();
      dispatch.poll(events);
      for (const auto& r : events.stats) {
        loaded.insert(r.rank);
        if (s.planner) s.planner->observe(r.step_samples);
      }
    }
    const double load_s = std::chrono::duration<double>(Clock::now() - start).count();
    spdlog::info("{} worker(s) loaded in {:.1f} s", want, load_s);
    start = Clock::now();
    last_progress = start;
  }
  // Requests in flight: a window per decode worker (their number changes when the planner re-splits).
  auto capacity = [&] { return s.window_per_worker * static_cast<int64_t>(link.workers().size()); };
  // Input order holds finished lines until their turn: bound that too.
  const std::size_t reorder_limit = static_cast<std::size_t>(std::max<int64_t>(capacity() * 8, 1024));

  uint64_t index = 0;
  bool input_done = false;
  int64_t lines_read = 0;

  // Input lines, with the planner's look-ahead: at the first line of an epoch
  // the whole epoch is read, its prompts built (kept for admission), and the
  // planner chooses the epoch's split before any of it is placed.
  std::deque<Line> ahead;
  struct Built {
    std::vector<int32_t> prompt;
    int64_t max_tokens = 0;
  };
  std::unordered_map<uint64_t, Built> built;
  struct EpochClock {
    Clock::time_point first;
    Clock::time_point last;
    int64_t open = 0;
    bool started = false;
  };
  std::map<int64_t, EpochClock> epoch_clock;
  std::map<int64_t, int64_t> planned_epoch;  // input epoch -> the planner's epoch (they differ once a resumed epoch had nothing left)
  auto epoch_of = [&](uint64_t i) { return static_cast<int64_t>(i / static_cast<uint64_t>(std::max<int64_t>(1, s.epoch_requests))); };
  auto plan_epoch = [&](uint64_t first) {
    for (int64_t k = static_cast<int64_t>(ahead.size()); k < s.epoch_requests; ++k) {
      Line l;
      if (!next_line(l)) break;
      ahead.push_back(std::move(l));
    }
    std::vector<planner::Request> reqs;
    for (std::size_t k = 0; k < ahead.size(); ++k) {
      const uint64_t i = first + k;
      if (ahead[k].too_long) continue;
      const std::string& l = ahead[k].text;
      if (l.find_first_not_of(" \t\r") == std::string::npos ||
          static_cast<int64_t>(i % static_cast<uint64_t>(shard_count)) != shard_index)
        continue;
      auto parsed = router::parse_batch_line(l);
      if (!std::holds_alternative<router::BatchRequest>(parsed)) continue;
      auto& req = std::get<router::BatchRequest>(parsed);
      if (done.contains(slurm::OutputKey::id(req.custom_id))) continue;  // written by an earlier run (resume): no work in this epoch
      auto ids = router::build_prompt(req, s.prompts);
      if (!std::holds_alternative<std::vector<int32_t>>(ids)) continue;
      Built b{std::get<std::vector<int32_t>>(std::move(ids)), req.params.max_tokens};
      reqs.push_back({static_cast<int64_t>(b.prompt.size()), b.max_tokens, 0, 0, -1});
      built.emplace(i, std::move(b));
    }
    if (reqs.empty()) return;
    const auto d = s.planner->decide(reqs);
    planned_epoch[epoch_of(first)] = d.epoch;
    if (d.changed()) {
      std::vector<int> prefill(s.worker_ranks.begin(), s.worker_ranks.begin() + d.split.prefill);
      if (link.set_roles(d.epoch, prefill)) dispatch.refresh();
    }
    spdlog::info("{}", d.describe());
  };
  auto read_line = [&](uint64_t i, Line& l) {
    if (s.planner && i % static_cast<uint64_t>(s.epoch_requests) == 0) plan_epoch(i);
    if (!ahead.empty()) {
      l = std::move(ahead.front());
      ahead.pop_front();
      return true;
    }
    return next_line(l);
  };

  auto fail = [&](uint64_t i, slurm::OutputKey key, const router::LineError& e) {
    out.put(i, std::move(key), router::format_error(e, s.outputs));
    stats.request_failed();
  };
  bool stopping = false;
  int stop_signal = 0;  // the signal that started the drain (a later one may follow: Slurm's TERM, then the script's USR1)
  Clock::time_point drain_deadline;
  auto progress = [&](bool final) {
    const double el = std::chrono::duration<double>(Clock::now() - start).count();
    const int64_t finished = stats.ok() + stats.failed();
    const double rps = el > 0 ? static_cast<double>(finished) / el : 0;
    const double tps = el > 0 ? static_cast<double>(stats.generated_tokens()) / el : 0;
    const std::string total = input_done ? std::to_string(lines_read) : std::to_string(lines_read) + "+";
    const double eta = input_done && rps > 0 ? static_cast<double>(lines_read - finished) / rps : -1;
    char line[256];
    std::snprintf(line, sizeof line, "%lld/%s done (%lld failed), %.2f req/s, %.1f output tok/s, ETA %s",
                  static_cast<long long>(finished), total.c_str(), static_cast<long long>(stats.failed()), rps, tps,
                  eta < 0 ? "?" : (std::to_string(static_cast<long long>(eta)) + " s").c_str());
    if (tty && !final) std::fprintf(stderr, "\r%s\033[K", line);
    else spdlog::info("progress: {}", line);
  };

  // Requests built and waiting to be placed (the reorder window).
  struct Ready {
    uint64_t i;
    InFlight f;
    service::WireRequest w;
    std::vector<uint64_t> hashes;  // the prompt's full blocks, when reordering
  };
  const int64_t window_size = std::max<int64_t>(1, cfg.router.reorder_window);
  std::deque<Ready> window;
  std::vector<uint64_t> last_placed;
  // Reads the next input line: skipped, failed (its error record written), or built into the window.
  Line read;
  auto read_one = [&]() {
    if (!read_line(index, read)) {
      input_done = true;
      return;
    }
    const std::string& line = read.text;
    const uint64_t i = index++;
    if ((!read.too_long && line.find_first_not_of(" \t\r") == std::string::npos) ||
        static_cast<int64_t>(i % static_cast<uint64_t>(shard_count)) != shard_index) {
      out.skip(i);  // blank lines carry no request; other array tasks take the other shards
      return;
    }
    ++lines_read;
    // A line past job.max_line_bytes was not kept: its error record carries the custom_id if one came first.
    auto parsed = router::parse_batch_line(line);
    if (read.too_long) {
      auto* bad = std::get_if<router::LineError>(&parsed);
      parsed = router::LineError{bad ? bad->custom_id : std::get<router::BatchRequest>(parsed).custom_id, 400,
                                 std::to_string(read.length) + " bytes, longer than job.max_line_bytes (" +
                                     std::to_string(s.max_line_bytes) +
                                     "); it was skipped unread: shorten it, or raise job.max_line_bytes if a "
                                     "prompt this long fits the context"};
    }
    // A line's key in the checkpoint: its custom_id the first time the id
    // appears, else (no usable id, or a duplicate) its line number. Ids are
    // remembered by their 64-bit hash (8-15 bytes a line): a line whose id's
    // hash an earlier line's id had is treated as a duplicate, so every id
    // key stands for one hash and the checkpoint's hashes are exact. Keys in
    // `done` were written by an earlier run and are skipped now.
    auto key_of = [&](const std::string& id) {
      if (!id.empty() && seen_ids.insert(slurm::custom_id_hash(id))) return slurm::OutputKey::id(id);
      return slurm::OutputKey::of_line(i + 1);
    };
    if (auto* e = std::get_if<router::LineError>(&parsed)) {
      slurm::OutputKey key = key_of(e->custom_id);
      if (done.contains(key)) {
        ++resumed;
        out.skip(i);
        return;
      }
      e->message = "line " + std::to_string(i + 1) + ": " + e->message;
      fail(i, std::move(key), *e);
      return;
    }
    auto& req = std::get<router::BatchRequest>(parsed);
    slurm::OutputKey key = key_of(req.custom_id);
    if (done.contains(key)) {
      ++resumed;
      out.skip(i);
      return;
    }
    if (key.is_line()) {
      fail(i, key, {req.custom_id, 400, "line " + std::to_string(i + 1) + ": duplicate custom_id '" + req.custom_id +
                                            "'; every line needs its own"});
      return;
    }
    std::variant<std::vector<int32_t>, router::LineError> prompt;
    if (auto b = built.find(i); b != built.end()) {  // built when the planner read ahead
      req.params.max_tokens = b->second.max_tokens;
      prompt = std::move(b->second.prompt);
      built.erase(b);
    } else {
      prompt = router::build_prompt(req, s.prompts);
    }
    if (auto* e = std::get_if<router::LineError>(&prompt)) {
      e->message = "line " + std::to_string(i + 1) + ": " + e->message;
      fail(i, std::move(key), *e);
      return;
    }
    InFlight f{std::move(req), std::get<std::vector<int32_t>>(std::move(prompt))};
    service::WireRequest w;
    w.id = i;
    w.prompt = f.prompt;
    w.params = f.request.params;
    w.rng_key = router::sampling_key(f.request.seed_given, f.request.params.seed, static_cast<uint64_t>(cfg.job.seed),
                             f.request.custom_id);
    std::vector<uint64_t> hashes;
    if (window_size > 1) hashes = kv::full_block_hashes(f.prompt, s.block_size);
    window.push_back({i, std::move(f), std::move(w), std::move(hashes)});
  };

  while (true) {
    if (!stopping && g_stop_signal.load() != 0) {
      stopping = true;
      stop_signal = g_stop_signal.load();
      drain_deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(cfg.job.drain_seconds * 1e3));
      out.commit();  // first: what is written is safe now, whatever kills the job before the drain ends
      spdlog::warn("signal {} received: no new requests; draining {} in flight for up to {:g} s", stop_signal,
                   in_flight.size(), cfg.job.drain_seconds);
    }
    // Admit lines while there is room. Built requests pass through a window
    // (router.reorder_window, else one): from it, the one sharing the longest
    // block prefix with the last request placed goes next, so requests with a
    // common prefix reach their worker together and it is computed once.
    while (!stopping && static_cast<int64_t>(in_flight.size()) < capacity() && out.buffered() < reorder_limit) {
      // An epoch starts only once the last one's requests are all placed.
      while (!input_done && static_cast<int64_t>(window.size()) < window_size &&
             !(s.planner && !window.empty() && index % static_cast<uint64_t>(s.epoch_requests) == 0))
        read_one();
      if (window.empty()) break;
      std::size_t k = 0;
      if (window_size > 1) {
        std::vector<std::span<const uint64_t>> prefixes;
        for (const auto& r : window) prefixes.emplace_back(r.hashes);
        k = router::next_by_shared_prefix(prefixes, last_placed);
      }
      Ready r = std::move(window[k]);
      window.erase(window.begin() + static_cast<std::ptrdiff_t>(k));
      r.f.prefill = dispatch.submit(std::move(r.w)).prefill;
      if (s.planner) {
        EpochClock& c = epoch_clock[epoch_of(r.i)];
        if (!c.started) c.first = Clock::now(), c.started = true;
        ++c.open;
      }
      last_placed = std::move(r.hashes);
      in_flight.emplace(r.i, std::move(r.f));
    }
    if ((input_done || stopping) && in_flight.empty() && (window.empty() || stopping)) break;
    if (stopping && Clock::now() >= drain_deadline) break;  // the rest is abandoned: not written, redone on resume

    events.clear();
    dispatch.poll(events);
    if (s.planner)
      for (const auto& r : events.stats) s.planner->observe(r.step_samples);
    for (auto& r : events.results) {
      auto it = in_flight.find(r.id);
      if (it == in_flight.end()) continue;
      InFlight& f = it->second;
      if (!r.ok) {
        // The engine names the request by its id (the 0-based line index): the line number alone says it.
        const std::string engine_name = "request " + std::to_string(r.id) + ": ";
        const std::string why = r.error.rfind(engine_name, 0) == 0 ? r.error.substr(engine_name.size()) : r.error;
        fail(r.id, slurm::OutputKey::id(f.request.custom_id),
             {f.request.custom_id, 400, "line " + std::to_string(r.id + 1) + ": " + why});
      } else {
        router::RequestResult res;
        res.prompt_ids = std::move(f.prompt);
        res.token_ids = std::move(r.tokens);
        res.text = std::move(r.text);
        res.finish_reason = r.finish_reason;
        res.logprobs = std::move(r.logprobs);
        res.prompt_logprobs = std::move(r.prompt_logprobs);
        res.ttft_ms = r.ttft_s * 1e3;
        res.e2e_ms = r.e2e_s * 1e3;
        const auto n = static_cast<double>(res.token_ids.size());
        res.itl_ms = n > 1 ? (res.e2e_ms - res.ttft_ms) / (n - 1) : 0.0;
        res.prompt_tokens_computed = r.prompt_tokens_computed;
        res.worker = r.worker;
        res.prefill_worker = f.prefill;
        res.kv_blocks_moved = r.kv_blocks_moved;
        stats.request_ok(static_cast<int64_t>(res.prompt_ids.size()), static_cast<int64_t>(res.token_ids.size()),
                         res.ttft_ms, res.itl_ms, res.e2e_ms);
        out.put(r.id, slurm::OutputKey::id(f.request.custom_id), router::format_result(f.request, res, s.outputs));
      }
      in_flight.erase(it);
      if (s.planner) {
        EpochClock& c = epoch_clock[epoch_of(r.id)];
        c.last = Clock::now();
        if (auto pe = planned_epoch.find(epoch_of(r.id)); --c.open == 0 && pe != planned_epoch.end())
          s.planner->measured(pe->second, std::chrono::duration<double>(c.last - c.first).count());
      }
    }
    out.maybe_commit(stopping);
    if (std::chrono::duration<double>(Clock::now() - last_progress).count() >= (tty ? 0.5 : cfg.job.progress_seconds)) {
      progress(false);
      last_progress = Clock::now();
    }
  }
  out.commit();
  const auto abandoned = static_cast<int64_t>(in_flight.size());
  if (stopping) {
    spdlog::warn("stopped by signal {}: {} request(s) in flight abandoned; every written line is committed; "
                 "rerun with --resume to finish the input", stop_signal, abandoned);
  }
  if (tty) std::fprintf(stderr, "\n");
  progress(true);

  for (const auto& r : link.shutdown(abandoned > 0)) {
    stats.add_rank(r);
    if (s.planner) s.planner->observe(r.step_samples);
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  nlohmann::json summary = stats.summary(elapsed);
  summary["requests_resumed"] = resumed;
  if (s.planner) {
    // The profile fitted to every step this job measured: for `tandem simulate --hardware`.
    s.planner->refit();
    summary["epochs"] = s.planner->summary();
    summary["planner_profile"] = s.planner->profile_json();
    const std::string profile_path = s.output + ".profile.toml";
    std::ofstream(profile_path) << s.planner->profile_toml();
    summary["planner_profile"]["file"] = profile_path;
  }
  summary["stopped_by_signal"] = stopping;
  summary["input_format"] = std::string(router::InputFile::name(in.format()));
  // Rank 0's memory does not grow with the input (docs/run.md): its peak, for anyone to check.
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) summary["router_peak_rss_bytes"] = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  if (!input_error.empty()) summary["input_error"] = input_error;
  summary["requests_abandoned"] = abandoned;
  std::ofstream sf(s.summary);
  if (!sf) throw Error(s.summary + ": cannot write the summary");
  sf << summary.dump(2) << "\n";
  return summary;
}

}  // namespace tandem::launcher
