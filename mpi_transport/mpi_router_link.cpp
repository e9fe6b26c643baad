#include "mpi_transport/mpi_router_link.h"

#include <sys/resource.h>

namespace tandem::mpi {

double process_cpu_seconds() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// The router should need a small fraction of a core while the workers compute:
// its CPU time since `started` (start-up, tokenizer and config loading, is not
// routing) over the wall time since.
service::RankReport router_report(std::chrono::steady_clock::time_point started, double cpu_at_start) {
  service::RankReport r;
  r.rank = 0;
  r.role = service::Role::kRouter;
  const double cpu = process_cpu_seconds() - cpu_at_start;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  r.busy_fraction = wall > 0 ? cpu / wall : 0;
  return r;
}

}  // namespace tandem::mpi
