// The OpenAI Batches API's worker on `tandem serve`'s rank 0: one thread
// that runs the batches one at a time, oldest first, through the same
// Inbox as the HTTP requests (router/loop/http_inbox.h). Interactive
// requests go first: batch lines in flight are at most http.batch_in_flight
// less the interactive requests in flight, so a slot a batch line frees
// goes to an interactive request that waits.
//
// Every line is answered once, as `tandem run` answers it (the same
// request, seed and output line), through the same exactly-once output
// (slurm/resumable_output.h) in the batch's work folder, committed every
// job.flush_seconds and when the server stops. A stopped or killed serve
// started again on the same http.batch_dir resumes its unfinished batches
// from their last commit. A finished batch (completed, cancelled, expired)
// splits its output into an output file (the answers) and an error file
// (the error records), both in the Files API's store.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "launcher/serve/batch_store.h"
#include "launcher/serve/file_store.h"
#include "router/batch_output.h"
#include "router/embeddings.h"
#include "router/loop/http_inbox.h"
#include "router/prompt_builder.h"

namespace tandem::launcher {

struct BatchRunnerSetup {
  const router::PromptContext* prompts = nullptr;
  router::OutputContext outputs;  // created: each batch's own
  router::EmbeddingPooling pooling;
  int64_t hidden = 0;
  uint64_t job_seed = 0;
  int64_t max_line_bytes = 1 << 20;
  int64_t in_flight = 64;  // batch lines in flight at most (less the interactive requests in flight)
  double flush_seconds = 10;     // commits at least this often (job.flush_seconds)
  double progress_seconds = 30;  // a progress line in the log this often (job.progress_seconds)
};

class BatchRunner {
 public:
  BatchRunner(BatchRunnerSetup s, BatchStore& store, FileStore& files, router::Inbox& inbox);
  ~BatchRunner() { stop(); }

  // Starts the thread, which first takes up the batches a stopped serve left
  // unfinished (unless another serve holds the folder: then a warning, and
  // this server runs no batches).
  void start();
  // After rank 0's loop has ended: what is in flight is abandoned (done again when resumed), the output committed.
  void stop();

  // Another serve runs the batches of this http.batch_dir.
  struct InUse : Error {
    using Error::Error;
  };
  // Queues a new batch (status "validating"): its input file is linked into
  // its work folder. Throws InUse, or tandem::Error when the disk refuses.
  BatchRecord create(BatchRecord b, const std::filesystem::path& input);
  // The batch as it is now (the running one's counts live).
  std::optional<BatchRecord> get(const std::string& id) const;
  std::vector<BatchRecord> list() const;
  // Cancels a batch: its lines in flight are cancelled, the lines finished are kept in its output file.
  // nullopt: no such batch; else the batch, "cancelling", or unchanged with not_running set (finished, or
  // finalizing: every line answered). Throws InUse when another server runs this folder's batches.
  std::optional<BatchRecord> cancel(const std::string& id, bool& not_running);

 private:
  // The folder's batches are this server's: batches/.lock held (flock) for
  // the server's life, so two servers never run the same batch. "" once
  // held; else why not (the same answer every time after).
  std::string claim();
  void wake();  // the runner looks at its queue now (a batch created or cancelled)
  void main();
  void fail(const BatchRecord& b, std::string why);
  void run(BatchRecord b);
  std::string run_lines(BatchRecord& b);
  // committed: the output was just committed and closed (else it is cut back to its last commit first).
  void finalize(BatchRecord& b, const std::string& status, bool committed = false);
  // The running batch's record changed: kept for get() and written (a
  // cancel() that came first turns it "cancelling").
  void publish(BatchRecord& b);

  BatchRunnerSetup s_;
  BatchStore& store_;
  FileStore& files_;
  router::Inbox& inbox_;

  mutable std::mutex mu_;                // the records: queue_, current_ (and the store's files)
  std::vector<std::string> queue_;       // unfinished batches not running, by creation
  std::optional<BatchRecord> current_;   // the running one, counts live
  int lock_fd_ = -1;                     // batches/.lock, held (claim)
  std::string claim_error_;

  std::mutex ready_mu_;  // what wakes the runner (the router thread posts answers: never held long)
  std::condition_variable ready_cv_;
  std::deque<uint64_t> ready_;  // lines whose Exchange has its answer
  std::string cancel_id_;  // the running batch to cancel (set under mu_ too: never another batch's)
  bool wake_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tandem::launcher
