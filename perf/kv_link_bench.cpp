// KV transfer bandwidth between two nodes, in one run: the MPI RMA, two-sided
// MPI and libfabric KV transports (post with a notification, poll until
// done, and the receiver's one-byte answer over TCP once the notification is
// in) against the raw link, a plain TCP stream between the same two hosts
// (the bytes, then a one-byte answer once all have arrived).
//   mpirun -np 2 --map-by node kv_link_bench [MAX_MIB] [PROVIDER]
// (perf/cluster_bench.sh runs it across two nodes of tests/cluster.) Rank 0
// sends, rank 1 receives; rank 1 keeps driving its transport while it waits
// (tcp providers and osc/pt2pt move data only then), yielding the CPU between
// calls as a busy worker's loop would. Sizes 64 KiB .. MAX_MIB (256) by 4x;
// several repetitions, each timing every path back to back in a turning
// order. Prints each path's median GB/s and each transport against the raw
// link as the median of the repetitions' ratios (paired samples, so a slow
// spell of the shared CPUs does not favour one path); a transport that cannot
// be opened here is "n/a".
// Never fails on time.
#include <mpi.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_rma/mpi_rma_transport.h"
#include "mpi_transport/mpi_two_sided/mpi_two_sided_transport.h"
#include "mpi_transport/transport_registry.h"

using Clock = std::chrono::steady_clock;
using tandem::mpi::KvTransport;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The raw link: rank 1 listens on any port, rank 0 connects to rank 1's host.
int connect_link(MPI_Comm world, int rank) {
  if (rank == 1) {
    const int l = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 1) != 0 ||
        getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return -1;
    char where[MPI_MAX_PROCESSOR_NAME + 16] = {};
    int n = 0;
    MPI_Get_processor_name(where, &n);
    std::snprintf(where + n, 16, " %d", ntohs(a.sin_port));
    MPI_Send(where, sizeof where, MPI_CHAR, 0, 7, world);
    const int s = accept(l, nullptr, nullptr);
    close(l);
    const int one = 1;  // the one-byte answers go at once (Nagle would hold one behind an unacknowledged other)
    if (s >= 0) setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
  }
  char where[MPI_MAX_PROCESSOR_NAME + 16] = {};
  MPI_Recv(where, sizeof where, MPI_CHAR, 1, 7, world, MPI_STATUS_IGNORE);
  char* space = std::strrchr(where, ' ');
  *space = 0;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(where, space + 1, &hints, &res) != 0) return -1;
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  const bool ok = s >= 0 && connect(s, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  if (!ok) return -1;
  const int one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

bool send_all(int s, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = write(s, p, n);
    if (k <= 0) return false;
    p += k, n -= static_cast<std::size_t>(k);
  }
  return true;
}
bool recv_all(int s, char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = read(s, p, n);
    if (k <= 0) return false;
    p += k, n -= static_cast<std::size_t>(k);
  }
  return true;
}

// One transfer of `bytes` over t: rank 0 posts and polls to done, rank 1
// drives its transport until the notification is there and then answers
// one byte on the raw link's socket, as the raw link's receiver does, so
// both are timed to the receiver having the data (a sender's "done" alone
// may come while the bytes still sit in its socket buffers). Seconds on
// rank 0, until its transfer is done and the answer is in.
double over(KvTransport& t, int rank, int sock, std::size_t bytes, std::size_t block) {
  std::vector<tandem::mpi::Notification> got;
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 1) {
    while (got.empty()) {
      if (!t.progress(got).ok()) std::abort();
      std::this_thread::yield();
    }
    const char ack = 1;
    if (!send_all(sock, &ack, 1)) std::abort();
    return 0;
  }
  std::vector<int32_t> ids(bytes / block);
  std::iota(ids.begin(), ids.end(), 0);
  const std::vector<uint8_t> note(24, 1);
  const auto t0 = Clock::now();
  tandem::mpi::XferId id = 0;
  if (!t.post(1, ids, ids, note, id).ok()) std::abort();
  bool answered = false;
  for (tandem::mpi::XferState st = tandem::mpi::XferState::kPending; st == tandem::mpi::XferState::kPending || !answered;) {
    if (st == tandem::mpi::XferState::kPending && !t.poll(id, st).ok()) std::abort();
    if (!t.progress(got).ok()) std::abort();
    char ack = 0;
    if (!answered) answered = recv(sock, &ack, 1, MSG_DONTWAIT) == 1;
    std::this_thread::yield();  // as a worker's loop backs off between looks: the CPUs are shared
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  t.release(id);
  return s;
}

double over_link(int sock, int rank, std::vector<char>& buf, std::size_t bytes) {
  MPI_Barrier(MPI_COMM_WORLD);
  char ack = 1;
  if (rank == 1) {
    if (!recv_all(sock, buf.data(), bytes) || !send_all(sock, &ack, 1)) std::abort();
    return 0;
  }
  const auto t0 = Clock::now();
  if (!send_all(sock, buf.data(), bytes) || !recv_all(sock, &ack, 1)) std::abort();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A transport with its pool, or null where it cannot be opened on every rank.
std::unique_ptr<KvTransport> open(std::unique_ptr<KvTransport> t, std::size_t block, int64_t blocks) {
  void* base = nullptr;
  const tandem::Status st = t ? t->allocate_pool(block, blocks, &base) : tandem::Status(tandem::StatusCode::kUnavailable, "not built");
  int ok = st.ok() ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (st.ok()) (void)t->destroy();
    return nullptr;
  }
  std::memset(base, 3, block * static_cast<std::size_t>(blocks));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::mpi::MpiEnv env(&argc, &argv);
  const int rank = env.rank();
  if (env.size() != 2) {
    if (rank == 0) std::fprintf(stderr, "kv_link_bench: run with mpirun -np 2, one rank per node\n");
    return 2;
  }
  const std::size_t max_bytes = static_cast<std::size_t>(argc > 1 ? std::atoi(argv[1]) : 256) << 20;
  const std::string provider = argc > 2 ? argv[2] : "";
  const std::size_t block = 64 << 10;
  const auto blocks = static_cast<int64_t>(max_bytes / block);
  auto rma = open(std::make_unique<tandem::mpi::MpiRmaTransport>(env.world()), block, blocks);
  auto two = open(std::make_unique<tandem::mpi::MpiTwoSidedTransport>(env.world()), block, blocks);
  auto fabric = open(tandem::mpi::make_optional_transport("libfabric", env.world(), provider), block, blocks);
  const int sock = connect_link(env.world(), rank);
  int link_ok = sock >= 0 ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&link_ok, &all_ok, 1, MPI_INT, MPI_MIN, env.world());
  if (!all_ok) {
    if (rank == 0) std::fprintf(stderr, "kv_link_bench: no TCP connection between the two ranks' hosts\n");
    return 3;
  }
  std::vector<char> buf(max_bytes, 5);
  const std::vector<std::string> hosts = tandem::mpi::rank_hosts(env.world());
  if (rank == 0) {
    std::printf("%s -> %s; libfabric provider: %s\n", hosts[0].c_str(), hosts[1].c_str(),
                !fabric ? "n/a" : provider.empty() ? "the default" : provider.c_str());
    std::printf("%10s %10s %10s %10s %10s %9s %9s %9s\n", "size", "link GB/s", "rma GB/s", "2-sided", "libfabric",
                "rma/link", "2s/link", "lf/link");
  }
  for (std::size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
    const int reps = bytes <= (4u << 20) ? 40 : bytes <= (64u << 20) ? 10 : 6;
    std::vector<double> t_link, t_rma, t_two, t_fab;
    // Each repetition times every path back to back, in an order that turns by one each time, so
    // that a slow spell of the shared CPUs falls on every path alike.
    for (int r = 0; r < reps; ++r)
      for (int k = 0; k < 4; ++k) switch ((r + k) % 4) {
          case 0: t_link.push_back(over_link(sock, rank, buf, bytes)); break;
          case 1: if (rma) t_rma.push_back(over(*rma, rank, sock, bytes, block)); break;
          case 2: if (two) t_two.push_back(over(*two, rank, sock, bytes, block)); break;
          default: if (fabric) t_fab.push_back(over(*fabric, rank, sock, bytes, block)); break;
        }
    if (rank != 0) continue;
    const double gb = static_cast<double>(bytes) / 1e9, link = gb / median(t_link);
    auto rate = [&](const std::vector<double>& t) { return t.empty() ? 0.0 : gb / median(t); };
    // Against the link: the median of each repetition's ratio (paired samples, taken moments apart).
    auto ratio = [&](const std::vector<double>& t) {
      std::vector<double> r;
      for (std::size_t i = 0; i < t.size(); ++i) r.push_back(t_link[i] / t[i]);
      return t.empty() ? 0.0 : 100 * median(r);
    };
    auto cell = [](double v, bool pct) {
      char s[32];
      if (v <= 0) std::snprintf(s, sizeof s, "n/a");
      else if (pct) std::snprintf(s, sizeof s, "%.0f%%", v);
      else std::snprintf(s, sizeof s, "%.3f", v);
      return std::string(s);
    };
    char size[32];
    if (bytes >= (1u << 20)) std::snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
    else std::snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
    std::printf("%10s %10.3f %10s %10s %10s %9s %9s %9s\n", size, link, cell(rate(t_rma), false).c_str(),
                cell(rate(t_two), false).c_str(), cell(rate(t_fab), false).c_str(), cell(ratio(t_rma), true).c_str(),
                cell(ratio(t_two), true).c_str(), cell(ratio(t_fab), true).c_str());
    std::fflush(stdout);
  }
  close(sock);
  for (auto* t : {rma.get(), two.get(), fabric.get()})
    if (t) (void)t->destroy();
  if (rank == 0)
    std::printf("x/link: the transport (post with a notification, poll to done, the receiver's one-byte answer once the\n"
                "notification is in) against the raw TCP stream of the same bytes (then a one-byte answer); target:\n"
                ">= 80%% from 1 MiB up\n");
  return 0;
}
