#include "mpi_transport/mpi_env.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/error.h"
#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {

std::vector<std::string> direct_launch_defaults() {
  // srun --mpi=pmix sets PMIX_RANK and SLURM_STEP_ID; mpirun's daemons set OMPI_COMM_WORLD_SIZE for their ranks.
  if (!std::getenv("PMIX_RANK") || !std::getenv("SLURM_STEP_ID") || std::getenv("OMPI_COMM_WORLD_SIZE")) return {};
  std::vector<std::string> set;
  for (const auto& [name, value] : {std::pair{"OMPI_MCA_pmix_base_async_modex", "1"},
                                    std::pair{"OMPI_MCA_pmix_base_collect_data", "0"}, std::pair{"PMIX_MCA_gds", "hash"}}) {
    if (std::getenv(name)) continue;
    setenv(name, value, 0);
    set.push_back(std::string(name) + "=" + value);
  }
  return set;
}

MpiEnv::MpiEnv(int* argc, char*** argv) : launch_settings_(direct_launch_defaults()) {
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw Error("MPI_Init_thread failed; is this started by mpirun or srun --mpi=pmix?");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiEnv::~MpiEnv() { MPI_Finalize(); }

std::string check_same_build(MPI_Comm comm, int protocol_version, const std::string& build) {
  // Each rank's version, host and build, in fixed-size records.
  constexpr std::size_t kText = 120;
  struct Record {
    int version;
    char host[64];
    char build[kText];
  };
  Record mine{};
  mine.version = protocol_version;
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  std::snprintf(mine.host, sizeof mine.host, "%s", host);
  std::snprintf(mine.build, sizeof mine.build, "%s", build.c_str());
  int size = 0;
  if (MPI_Comm_size(comm, &size) != MPI_SUCCESS) return "MPI_Comm_size failed while checking the ranks' builds";
  std::vector<Record> all(static_cast<std::size_t>(size));
  if (int rc = MPI_Allgather(&mine, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, comm); rc != MPI_SUCCESS)
    return mpi_status(rc, "MPI_Allgather", __FILE__, __LINE__).to_string();
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r].version == all[0].version && std::strncmp(all[r].build, all[0].build, kText) == 0) continue;
    auto text = [](const char* s, std::size_t n) { return std::string(s, strnlen(s, n)); };
    return "rank " + std::to_string(r) + " (on " + text(all[r].host, sizeof all[r].host) + ") runs tandem protocol " +
           std::to_string(all[r].version) + ", build \"" + text(all[r].build, kText) + "\", but rank 0 (on " +
           text(all[0].host, sizeof all[0].host) + ") runs protocol " + std::to_string(all[0].version) + ", build \"" +
           text(all[0].build, kText) + "\"; run the same tandem binary on every node";
  }
  return "";
}

std::vector<std::string> rank_hosts(MPI_Comm comm) {
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  TANDEM_MPI_OR_THROW(MPI_Get_processor_name(mine, &len));
  int size = 0;
  TANDEM_MPI_OR_THROW(MPI_Comm_size(comm, &size));
  std::vector<char> all(static_cast<std::size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  TANDEM_MPI_OR_THROW(MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm));
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) {
    const char* h = all.data() + static_cast<std::ptrdiff_t>(r) * MPI_MAX_PROCESSOR_NAME;
    out.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
  }
  return out;
}

Mailbox::~Mailbox() {
  for (auto& p : pending_) {
    MPI_Cancel(&p.request);
    MPI_Request_free(&p.request);
  }
  // A message still arriving (its sender lost) may be written into as long as MPI runs: its bytes stay.
  for (auto& in : incoming_)
    if (!in.done) (void)new std::vector<uint8_t>(std::move(in.message.bytes));
}

Status Mailbox::send(int dest, int tag, std::vector<uint8_t> bytes) {
  pending_.push_back({MPI_REQUEST_NULL, std::move(bytes)});
  Pending& p = pending_.back();
  TANDEM_MPI(MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_BYTE, dest, tag, comm_, &p.request));
  return progress();
}

Status Mailbox::try_recv(std::optional<Message>& out, int source, int tag) {
  out.reset();
  auto matches = [&](const Message& m) {
    return (source == MPI_ANY_SOURCE || m.source == source) && (tag == MPI_ANY_TAG || m.tag == tag);
  };
  // The first received message the caller asks for that nothing matched earlier from its source holds back.
  auto hand_over = [&]() -> bool {
    std::vector<int> held;  // sources with an earlier message not handed over
    for (auto it = incoming_.begin(); it != incoming_.end(); ++it) {
      if (!it->done) {
        int done = 0;
        TANDEM_MPI_OR_THROW(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE));
        it->done = done != 0;
      }
      const bool free_source = std::find(held.begin(), held.end(), it->message.source) == held.end();
      if (it->done && free_source && matches(it->message)) {
        out = std::move(it->message);
        incoming_.erase(it);
        return true;
      }
      if (free_source) held.push_back(it->message.source);
    }
    return false;
  };
  try {
    if (hand_over()) return Status();
    int flag = 0;
    MPI_Message matched = MPI_MESSAGE_NULL;
    MPI_Status st;
    TANDEM_MPI(MPI_Improbe(source, tag, comm_, &flag, &matched, &st));
    if (!flag) return Status();
    int count = 0;
    TANDEM_MPI(MPI_Get_count(&st, MPI_BYTE, &count));
    Incoming& in = incoming_.emplace_back();
    in.message.source = st.MPI_SOURCE;
    in.message.tag = st.MPI_TAG;
    in.message.bytes.resize(static_cast<std::size_t>(count));
    TANDEM_MPI(MPI_Imrecv(in.message.bytes.data(), count, MPI_BYTE, &matched, &in.request));
    hand_over();
  } catch (const Error& e) {
    return Status(StatusCode::kInternal, e.what());
  }
  return Status();
}

Status Mailbox::progress() {
  while (!pending_.empty()) {
    int done = 0;
    TANDEM_MPI(MPI_Test(&pending_.front().request, &done, MPI_STATUS_IGNORE));
    if (!done) break;
    pending_.pop_front();
  }
  // Later sends may finish before earlier ones: test them too, without reordering.
  for (auto& p : pending_) {
    if (p.request == MPI_REQUEST_NULL) continue;
    int done = 0;
    TANDEM_MPI(MPI_Test(&p.request, &done, MPI_STATUS_IGNORE));
  }
  while (!pending_.empty() && pending_.front().request == MPI_REQUEST_NULL) pending_.pop_front();
  return Status();
}

Status Mailbox::flush() {
  Backoff backoff;
  while (!pending_.empty()) {
    TANDEM_RETURN_IF_ERROR(progress());
    if (!pending_.empty()) backoff.idle();
  }
  return Status();
}

}  // namespace tandem::mpi
