#include "launcher/run/links.h"

#include <sys/resource.h>

namespace tandem::launcher {

// The router should need a small fraction of a core while the workers compute.
router::RankReport router_report(std::chrono::steady_clock::time_point started) {
  router::RankReport r;
  r.rank = 0;
  r.role = "router";
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  r.busy_fraction = wall > 0 ? cpu / wall : 0;
  return r;
}

}  // namespace tandem::launcher
