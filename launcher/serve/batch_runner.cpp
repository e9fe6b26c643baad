#include "launcher/serve/batch_runner.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "router/input_scan.h"
#include "router/loop/batch_input.h"
#include "router/loop/batch_lines.h"
#include "router/loop/line_ledger.h"
#include "slurm/resumable_output.h"

namespace tandem::launcher {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A finished batch's output and error files keep their ids when it is finalised again after a crash.
std::string file_id_of(const std::string& batch, const std::string& kind) {
  const uint64_t a = slurm::custom_id_hash(batch + "/" + kind), b = slurm::custom_id_hash(kind + "/" + batch);
  return fmt::format("file-{:016x}{:08x}", a, static_cast<uint32_t>(b));
}

const char* url_of(router::Endpoint e) {
  switch (e) {
    case router::Endpoint::kCompletions: return "/v1/completions";
    case router::Endpoint::kChat: return "/v1/chat/completions";
    case router::Endpoint::kEmbeddings: return "/v1/embeddings";
  }
  return "?";
}

const char* label_of(router::Endpoint e) {
  return e == router::Endpoint::kChat ? "chat" : e == router::Endpoint::kEmbeddings ? "embeddings" : "completions";
}

// Adds an output line written before to the counts; whether it is an answer (error null), not an error record.
bool count_line(BatchCounts& c, const std::string& line) {
  const json j = json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_null()) {
    ++c.failed;
    return false;
  }
  ++c.completed;
  const json usage = j.value("response", json::object()).value("body", json::object()).value("usage", json::object());
  c.input_tokens += usage.value("prompt_tokens", int64_t{0});
  c.output_tokens += usage.value("completion_tokens", int64_t{0});
  return true;
}

// A resumed batch's counts: its record's, plus the lines committed after the record was last written
// (a kill between the output's commit and the record's write).
void reconcile(BatchCounts& c, const fs::path& output, int64_t committed) {
  if (c.committed_bytes == committed) return;
  if (c.committed_bytes > committed) c = BatchCounts{c.total};  // counted lines the output no longer has: recount
  std::ifstream in(output, std::ios::binary);
  in.seekg(c.committed_bytes);
  std::string line;
  int64_t at = c.committed_bytes;
  while (at < committed && std::getline(in, line)) {
    at += static_cast<int64_t>(line.size()) + 1;
    count_line(c, line);
  }
  c.committed_bytes = committed;
}

void sync_close(std::FILE* f, const fs::path& p) {
  const bool ok = f && std::fflush(f) == 0 && !std::ferror(f) && ::fsync(fileno(f)) == 0;
  if (f && std::fclose(f) != 0) f = nullptr;
  if (!ok || !f) throw Error("cannot write " + p.string() + " (disk full?); free space in http.batch_dir");
}

}  // namespace

BatchRunner::BatchRunner(BatchRunnerSetup s, BatchStore& store, FileStore& files, router::Inbox& inbox)
    : s_(std::move(s)), store_(store), files_(files), inbox_(inbox) {}

std::string BatchRunner::claim() {
  std::lock_guard lock(mu_);
  if (lock_fd_ >= 0 || !claim_error_.empty()) return claim_error_;
  const fs::path dir = store_.work_dir("");
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path path = dir / ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return claim_error_ = "cannot open " + path.string() + " (" + std::strerror(errno) + "); set http.batch_dir to a "
                                    "folder this job may write";
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char who[256] = {};
    const ssize_t n = ::pread(fd, who, sizeof who - 1, 0);
    ::close(fd);
    return claim_error_ = "http.batch_dir " + dir.parent_path().string() + " is used by another tandem serve (" +
                          (n > 0 ? std::string(who, static_cast<std::size_t>(n)) : std::string("unknown")) +
                          "): its batches are that server's; give this server a folder of its own (http.batch_dir)";
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string who = "pid " + std::to_string(::getpid()) + " on " + host;
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) < 0)
    spdlog::warn("{}: cannot record this server in it; the lock holds all the same", path.string());
  lock_fd_ = fd;  // held for the server's life: the kernel lets it go when the process ends, however it ends
  store_.sweep();  // only the holder tidies the folder: another server's writes are never in the way
  return "";
}

void BatchRunner::start() {
  std::vector<std::string> unfinished;
  const auto all = store_.list();  // newest first
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (it->unfinished()) unfinished.push_back(it->id);
  if (!unfinished.empty()) {
    if (const std::string why = claim(); !why.empty()) {
      spdlog::warn("{} unfinished batch(es) not resumed: {}", unfinished.size(), why);
      return;
    }
    spdlog::info("{} unfinished batch(es) in {}: resuming them", unfinished.size(), store_.work_dir("").string());
  }
  {
    std::lock_guard lock(mu_);
    queue_ = std::move(unfinished);  // oldest first
  }
  thread_ = std::thread([this] { main(); });
}

void BatchRunner::stop() {
  {
    std::lock_guard lock(ready_mu_);
    stop_ = true;
  }
  ready_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

BatchRecord BatchRunner::create(BatchRecord b, const fs::path& input) {
  if (const std::string why = claim(); !why.empty()) throw InUse(why);
  const fs::path work = store_.work_dir(b.id);
  std::error_code ec;
  fs::create_directories(work, ec);
  fs::create_hard_link(input, work / "input", ec);  // the user may delete the file now: the batch keeps its bytes
  if (ec) fs::copy_file(input, work / "input", fs::copy_options::overwrite_existing, ec);
  if (ec) {
    fs::remove_all(work, ec);
    throw Error("cannot link " + input.string() + " into " + work.string() + ": " + ec.message());
  }
  try {
    std::lock_guard lock(mu_);
    store_.save(b);
    queue_.push_back(b.id);
  } catch (const Error&) {
    fs::remove_all(work, ec);
    throw;
  }
  wake();
  spdlog::info("batch {}: created from {} ({})", b.id, b.input_file_id, b.endpoint);
  return b;
}

std::optional<BatchRecord> BatchRunner::get(const std::string& id) const {
  std::lock_guard lock(mu_);
  if (current_ && current_->id == id) return current_;
  return store_.get(id);
}

std::vector<BatchRecord> BatchRunner::list() const {
  auto all = store_.list();
  std::lock_guard lock(mu_);
  if (current_)
    for (auto& b : all)
      if (b.id == current_->id) b = *current_;
  return all;
}

std::optional<BatchRecord> BatchRunner::cancel(const std::string& id, bool& not_running) {
  if (const std::string why = claim(); !why.empty()) throw InUse(why);  // its record is the other server's to write
  std::unique_lock lock(mu_);
  const bool running = current_ && current_->id == id;
  std::optional<BatchRecord> b = running ? current_ : store_.get(id);
  if (!b) return std::nullopt;
  // Finished, or finalizing (all its lines are answered): nothing left to cancel.
  not_running = !b->unfinished() || b->status == "finalizing";
  if (not_running || b->status == "cancelling") return b;
  b->status = "cancelling";
  b->times["cancelling_at"] = unix_now();
  store_.save(*b);
  if (running) {
    current_ = b;
    std::lock_guard r(ready_mu_);  // under mu_ still: the runner cannot have moved on to another batch
    cancel_id_ = id;
  }
  lock.unlock();
  wake();  // queued: the runner takes cancelled ones first
  spdlog::info("batch {}: cancelling", id);
  return b;
}

void BatchRunner::wake() {
  {
    std::lock_guard r(ready_mu_);
    wake_ = true;
  }
  ready_cv_.notify_all();
}

void BatchRunner::publish(BatchRecord& b) {
  std::lock_guard lock(mu_);
  if (current_ && current_->status == "cancelling" && (b.status == "validating" || b.status == "in_progress")) {
    b.status = "cancelling";  // cancel() came first: the API said so
    b.times = current_->times;
  }
  current_ = b;
  store_.save(b);
}

void BatchRunner::main() {
  for (;;) {
    std::optional<BatchRecord> next;
    bool idle = false;
    {
      std::lock_guard lock(mu_);
      idle = queue_.empty();
    }
    {
      std::unique_lock r(ready_mu_);
      if (idle || inbox_.draining)
        ready_cv_.wait_for(r, std::chrono::milliseconds(500), [&] { return stop_ || wake_; });
      wake_ = false;
      if (stop_) return;
    }
    if (inbox_.draining) continue;  // the server stops: what is left resumes when it starts again
    {
      std::lock_guard lock(mu_);
      // Cancelled ones first, then those past their window (their output files are due), then the oldest.
      const int64_t now = unix_now();
      auto due = [&](const std::string& id, bool expired) {
        const auto b = store_.get(id);
        return b && (expired ? b->expires_at <= now : b->status == "cancelling");
      };
      auto pick = std::find_if(queue_.begin(), queue_.end(), [&](const std::string& id) { return due(id, false); });
      if (pick == queue_.end()) pick = std::find_if(queue_.begin(), queue_.end(), [&](const std::string& id) { return due(id, true); });
      if (pick == queue_.end() && !queue_.empty()) pick = queue_.begin();
      if (pick != queue_.end()) {
        next = store_.get(*pick);
        queue_.erase(pick);
        current_ = next;
        std::lock_guard r(ready_mu_);
        ready_.clear();  // the last batch's (its Exchanges are all answered or abandoned)
      }
    }
    if (!next) continue;
    try {
      run(*next);
    } catch (const std::exception& e) {  // a disk that refuses, a damaged input: the batch fails, its answers kept
      fail(*next, e.what());
    }
    std::lock_guard lock(mu_);
    current_.reset();
  }
}

// The batch ends "failed" with why. The answers committed so far stay in its
// work folder (never deleted with it); a folder with none is removed.
void BatchRunner::fail(const BatchRecord& failed, std::string why) {
  const fs::path work = store_.work_dir(failed.id), output = work / "output.jsonl";
  // The input is the user's file, by its id (its link in the work folder is ours).
  const std::string link = (work / "input").string();
  for (std::size_t at; (at = why.find(link)) != std::string::npos;)
    why.replace(at, link.size(), "input file " + failed.input_file_id);
  std::error_code ec;
  const bool answers = fs::exists(output, ec) && fs::file_size(output, ec) > 0;
  if (answers) why += "; the answers committed before it are kept in " + output.string();
  spdlog::error("batch {}: {}", failed.id, why);
  std::lock_guard lock(mu_);
  BatchRecord b = current_ ? *current_ : failed;
  b.status = "failed";
  b.times["failed_at"] = unix_now();
  b.errors = json::array({{{"code", "batch_failed"}, {"message", why}, {"param", nullptr}, {"line", nullptr}}});
  try {
    store_.save(b);  // if this fails too, the record stays unfinished: a restart takes the batch up again
    if (!answers) fs::remove_all(work, ec);
  } catch (const std::exception& e) {
    spdlog::error("batch {}: {}", b.id, e.what());
  }
}

void BatchRunner::run(BatchRecord b) {
  if (b.status == "finalizing") return finalize(b, "completed");
  if (b.status == "cancelling") return finalize(b, "cancelled");
  if (b.status == "validating" && unix_now() >= b.expires_at) return finalize(b, "expired");  // never started
  // (One that had started reads its output first: every line answered, it completes whatever the time.)
  // The output is closed before it is finalised (its lock released).
  if (const std::string end = run_lines(b); !end.empty()) finalize(b, end, true);
}

// The batch's lines through the Inbox, every answer into its resumable
// output. Returns how it ended ("completed", "cancelled", "expired"), or ""
// when the server stops first.
std::string BatchRunner::run_lines(BatchRecord& b) {
  const fs::path work = store_.work_dir(b.id), input = work / "input", output = work / "output.jsonl";
  // Read through before any work: the count of requests, compressed data checked, what an earlier run answered.
  const auto scan = router::InputScan::run({input.string(), output.string(), s_.max_line_bytes, true, 0, 1, true});
  slurm::ResumableOutput file(output.string(), true);
  reconcile(b.counts, output, file.committed_bytes());
  b.counts.total = scan ? static_cast<int64_t>(scan->requests()) : 0;
  const bool resumed = scan && scan->answered() > 0;
  b.status = "in_progress";
  b.times.try_emplace("in_progress_at", unix_now());
  publish(b);
  spdlog::info("batch {}: {} request(s){}", b.id, b.counts.total,
               resumed ? fmt::format(", {} answered before this start: resuming", scan->answered()) : "");

  router::OutputContext outputs = s_.outputs;
  outputs.created = b.created_at;  // the ids a rerun writes are the same
  router::LineLedger ledger(scan);
  router::BatchInput in({input.string(), s_.max_line_bytes, 0, s_.prompts, 16, false, nullptr}, scan, {0, 1});
  const router::Endpoint endpoint = b.endpoint == "/v1/chat/completions" ? router::Endpoint::kChat
                                    : b.endpoint == "/v1/embeddings"     ? router::Endpoint::kEmbeddings
                                                                         : router::Endpoint::kCompletions;
  struct Pending {
    slurm::OutputKey key;
    std::shared_ptr<router::Exchange> ex;
  };
  std::unordered_map<uint64_t, Pending> pending;
  // Every line answered before this start (a kill before it was finalised): nothing to read.
  bool input_done = scan && scan->answered() >= scan->requests(), cancels_sent = false;
  auto last_commit = Clock::now();
  // Progress in the log, as `tandem run` writes it (job.progress_seconds): a Slurm user tails the job's log.
  const auto started = Clock::now();
  auto last_progress = started;
  const int64_t done_at_start = b.counts.completed + b.counts.failed, tokens_at_start = b.counts.output_tokens;
  auto progress = [&] {
    const double el = std::chrono::duration<double>(Clock::now() - started).count();
    const int64_t done = b.counts.completed + b.counts.failed;
    const double rps = el > 0 ? static_cast<double>(done - done_at_start) / el : 0;
    spdlog::info("batch {}: {}/{} done ({} failed), {:.2f} req/s, {:.1f} output tok/s, ETA {}", b.id, done, b.counts.total,
                 b.counts.failed, rps, el > 0 ? static_cast<double>(b.counts.output_tokens - tokens_at_start) / el : 0.0,
                 rps > 0 ? fmt::format("{:.0f} s", static_cast<double>(b.counts.total - done) / rps) : std::string("?"));
  };
  auto write = [&](const slurm::OutputKey& key, const router::Answer& a) {
    file.write(key, a.line);
    ++(a.ok ? b.counts.completed : b.counts.failed);
    b.counts.input_tokens += a.prompt_tokens;
    b.counts.output_tokens += a.output_tokens;
  };
  // The next line: an error record, or a request posted to the Inbox. False at the input's end.
  auto post_next = [&]() -> bool {
    router::PreparedLine p;
    if (!in.next(p)) {
      if (!in.error().empty()) throw Error(in.error());
      return false;
    }
    if (p.skip) return true;
    slurm::OutputKey key = ledger.settle(p);
    if (p.done) {  // answered before this start
      ledger.answered_before();
      return true;
    }
    auto taken = router::take_line(p, key, s_.max_line_bytes, s_.pooling);
    std::optional<router::LineError> bad;
    if (auto* e = std::get_if<router::LineError>(&taken)) bad = std::move(*e);
    auto* f = std::get_if<router::LineRequest>(&taken);
    const std::string at = "line " + std::to_string(p.i + 1) + ": ";
    if (f && f->request.endpoint != endpoint)
      bad = router::LineError{f->request.custom_id, 400,
                              at + "its url is " + url_of(f->request.endpoint) + ", not the batch's endpoint " +
                                  b.endpoint + "; a batch runs one endpoint: put this line in a batch of its own"};
    else if (f && !f->request.model.empty() && f->request.model != s_.outputs.served_name)
      bad = router::LineError{f->request.custom_id, 404,
                              at + "the model '" + f->request.model + "' does not exist; this server serves '" +
                                  s_.outputs.served_name + "'"};
    if (bad) {
      router::Answer a;
      a.line = router::format_error(*bad, outputs);
      write(key, a);
      return true;
    }
    auto ex = std::make_shared<router::Exchange>();
    ex->req = std::move(f->request);
    ex->prompt = std::move(f->prompt);
    ex->endpoint = label_of(endpoint);
    ex->notify = [this, i = p.i] {
      {
        std::lock_guard r(ready_mu_);
        ready_.push_back(i);
      }
      ready_cv_.notify_all();
    };
    pending.emplace(p.i, Pending{std::move(key), ex});
    inbox_.post(std::move(ex));
    return true;
  };

  for (;;) {
    std::deque<uint64_t> ready;
    bool cancel = false, stop = false;
    {
      std::unique_lock r(ready_mu_);
      ready_cv_.wait_for(r, std::chrono::milliseconds(200),
                         [&] { return !ready_.empty() || stop_ || (cancel_id_ == b.id && !cancels_sent); });
      ready.swap(ready_);
      cancel = cancel_id_ == b.id;
      stop = stop_;
    }
    for (const uint64_t i : ready) {
      const auto it = pending.find(i);
      if (it == pending.end()) continue;
      std::optional<router::ExchangeEvent> fin;
      {
        std::lock_guard l(it->second.ex->mu);
        for (auto& e : it->second.ex->events)
          if (e.final) fin = std::move(e);
      }
      if (!fin) continue;
      const auto ex = it->second.ex;
      const slurm::OutputKey key = std::move(it->second.key);
      pending.erase(it);
      // Stopped, cancelled or aborted: not an answer. The line is done again when the batch resumes.
      if (fin->stopped || ex->cancelled || fin->final->finish_reason == "abort") continue;
      router::LineRequest f{std::move(ex->req), std::move(ex->prompt)};
      write(key, router::answer_line(i, f, std::move(*fin->final), -1, outputs, s_.pooling, s_.hidden));
    }
    const bool expired = unix_now() >= b.expires_at;
    if ((cancel || expired) && !cancels_sent) {
      for (auto& [i, p] : pending) {
        p.ex->cancelled = true;
        inbox_.cancel(p.ex);
      }
      cancels_sent = true;
    }
    if (stop) pending.clear();  // rank 0's loop has ended: what it did not answer is done again on resume
    const bool stopping = stop || inbox_.draining;
    const bool halt = cancel || expired || stopping;
    while (!halt && !input_done &&
           static_cast<int64_t>(pending.size()) < s_.in_flight - inbox_.active.load())  // interactive first
      input_done = !post_next();
    const bool finished = input_done && pending.empty();
    const bool halted = halt && pending.empty();
    if (finished || halted ||
        std::chrono::duration<double>(Clock::now() - last_commit).count() >= (halt ? 1.0 : s_.flush_seconds)) {
      file.commit();
      b.counts.committed_bytes = file.committed_bytes();
      publish(b);  // may turn it "cancelling"
      last_commit = Clock::now();
    }
    if (std::chrono::duration<double>(Clock::now() - last_progress).count() >= s_.progress_seconds) {
      progress();
      last_progress = Clock::now();
    }
    if (finished) return b.status == "cancelling" ? "cancelled" : "completed";
    if (halted) {
      if (b.status == "cancelling" || cancel) return "cancelled";
      if (expired) return "expired";
      spdlog::info("batch {}: {} of {} done; the server stops: it resumes where it is when the server starts again on "
                   "this http.batch_dir", b.id, b.counts.completed + b.counts.failed, b.counts.total);
      return "";
    }
  }
}

// The output split into the batch's output file (answers) and error file
// (error records), both into the Files API's store; the work folder goes.
// Done again whole when a kill interrupts it (the file ids stay).
void BatchRunner::finalize(BatchRecord& b, const std::string& status, bool committed) {
  const fs::path work = store_.work_dir(b.id), output = work / "output.jsonl";
  if (status == "completed" && b.status != "finalizing") {
    b.status = "finalizing";
    b.times["finalizing_at"] = unix_now();
    publish(b);
  }
  std::error_code ec;
  if (fs::exists(output, ec)) {
    if (!committed) slurm::ResumableOutput cut(output.string(), true);  // back to its last commit (a kill after it)
    const fs::path answers = work / "answers.part", errors = work / "errors.part";
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> a(std::fopen(answers.c_str(), "wb"), std::fclose),
        e(std::fopen(errors.c_str(), "wb"), std::fclose);
    if (!a || !e) throw Error("cannot write in " + work.string() + " (" + std::strerror(errno) + "); free space in http.batch_dir");
    std::ifstream in(output, std::ios::binary);
    std::string line;
    BatchCounts counts{b.counts.total};
    int64_t read = 0;
    while (std::getline(in, line)) {
      read += static_cast<int64_t>(line.size()) + 1;
      const bool ok = count_line(counts, line);
      line.push_back('\n');
      if (std::fwrite(line.data(), 1, line.size(), ok ? a.get() : e.get()) != line.size())
        throw Error("cannot write in " + work.string() + " (disk full?); free space in http.batch_dir");
    }
    if (in.bad() || read != static_cast<int64_t>(fs::file_size(output)))
      throw Error("cannot read " + output.string() + " through (" + std::to_string(read) + " bytes read)");
    sync_close(a.release(), answers);
    sync_close(e.release(), errors);
    counts.committed_bytes = read;
    b.counts = counts;
    if (counts.completed > 0)
      b.output_file_id = files_.adopt(answers, file_id_of(b.id, "output"), b.id + "_output.jsonl", "batch_output").id;
    if (counts.failed > 0)
      b.error_file_id = files_.adopt(errors, file_id_of(b.id, "error"), b.id + "_error.jsonl", "batch_output").id;
  }
  b.status = status;
  b.times[status + "_at"] = unix_now();
  publish(b);
  fs::remove_all(work, ec);
  spdlog::info("batch {}: {}: {} answered, {} error record(s)", b.id, status, b.counts.completed, b.counts.failed);
}

}  // namespace tandem::launcher
