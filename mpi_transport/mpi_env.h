// MPI for one Tandem process: initialisation at the thread level Tandem needs
// (FUNNELED: only the rank's main loop calls MPI, which keeps osc/pt2pt usable
// on TCP-only clusters), the fixed communicators, and small point-to-point
// messaging that never blocks: sends are MPI_Isend kept in an outbox until
// complete; receives are probed. Not thread-safe by design.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "common/backoff.h"
#include "common/status.h"

namespace tandem::mpi {

// The job's messages are tagged by their service::MsgType
// (runtime/service/protocol.h); transports talk on communicators of their own.

class MpiEnv {
 public:
  // MPI_Init_thread(FUNNELED); errors return rather than abort. Started by srun
  // directly, it first sets direct_launch_defaults().
  MpiEnv(int* argc, char*** argv);
  ~MpiEnv();
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }
  // What direct_launch_defaults() set before MPI_Init ("NAME=value"), for the log.
  const std::vector<std::string>& launch_settings() const { return launch_settings_; }

 private:
  int rank_ = 0, size_ = 1;
  std::vector<std::string> launch_settings_;
};

// When srun started this process directly (Slurm's PMIx, no mpirun), the Open
// MPI settings that make its start-up safe, each unless the environment sets it:
// one PMIx fence in MPI_Init, after the process is ready for messages
// (pmix_base_async_modex=1, pmix_base_collect_data=0: peers' addresses are
// fetched when first needed), and PMIx's hash store (PMIX_MCA_gds=hash). With
// Open MPI 4.1's two fences under Slurm 22.05's PMIx a rank sometimes left
// MPI_Init and sent before a slower rank had passed the first one, which then
// died on the message (SIGSEGV at address 0 inside MPI_Init; 4 of 300 3-node
// sruns of a bare MPI program under load here, none of 600 with these set).
// The names set, for the log; none when not launched by srun.
std::vector<std::string> direct_launch_defaults();

// Collective over `comm`: "" when every rank runs the same protocol version
// and build as rank 0, else one line naming the first rank that does not
// (a node with a stale binary would otherwise misread the messages).
[[nodiscard]] std::string check_same_build(MPI_Comm comm, int protocol_version, const std::string& build);
// Collective over `comm`: every rank's host (MPI_Get_processor_name), by rank. Throws tandem::Error.
std::vector<std::string> rank_hosts(MPI_Comm comm);

struct Message {
  int source = 0;
  int tag = 0;
  std::vector<uint8_t> bytes;
};

// Non-blocking point-to-point messaging on one communicator.
class Mailbox {
 public:
  explicit Mailbox(MPI_Comm comm) : comm_(comm) {}
  ~Mailbox();

  // Queues a send; the bytes are owned until it completes.
  Status send(int dest, int tag, std::vector<uint8_t> bytes);
  // One message (any source and tag, or the given ones), if one has fully
  // arrived. Never waits: a message is matched, then received in the
  // background; a large one whose data is still coming is handed over by a
  // later call. Messages from one source are handed over in the order they
  // were matched (a source's message matched by one filter holds back its
  // later ones matched by another), as a blocking receive would.
  Status try_recv(std::optional<Message>& out, int source = MPI_ANY_SOURCE, int tag = MPI_ANY_TAG);
  // Completes what it can of the queued sends; call it every loop.
  Status progress();
  // Waits until every queued send has completed (polling with back-off).
  Status flush();
  bool idle() const { return pending_.empty(); }

 private:
  struct Pending {
    MPI_Request request;
    std::vector<uint8_t> bytes;
  };
  struct Incoming {  // matched, being received or received, not yet handed over
    MPI_Request request = MPI_REQUEST_NULL;
    Message message;
    bool done = false;
  };
  MPI_Comm comm_;
  std::deque<Pending> pending_;
  std::deque<Incoming> incoming_;  // in match order
};

// Idle loops back off (common/backoff.h): the name mpi code has always used.
using tandem::Backoff;

}  // namespace tandem::mpi
