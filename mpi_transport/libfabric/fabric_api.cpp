#include "mpi_transport/libfabric/fabric_api.h"

#include <dlfcn.h>
#include <signal.h>

#include <array>
#include <mutex>

namespace tandem::mpi::fabric {
namespace {

struct Loaded {
  Api api{};
  bool ok = false;
  std::string why;
};

template <typename F>
bool resolve(void* lib, const char* name, F& out, std::string& why) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  if (!out && why.empty()) why = std::string("libfabric.so.1 has no ") + name;
  return out != nullptr;
}

Loaded load() {
  Loaded l;
  // A provider library may install signal handlers as it loads (libinfinipath: TERM, SEGV and more);
  // the process keeps the ones it had (rank 0's drain on TERM, for one).
  std::array<struct sigaction, NSIG> before{};
  for (int s = 1; s < NSIG; ++s) sigaction(s, nullptr, &before[static_cast<std::size_t>(s)]);
  void* lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  for (int s = 1; s < NSIG; ++s)
    if (s != SIGKILL && s != SIGSTOP) sigaction(s, &before[static_cast<std::size_t>(s)], nullptr);
  if (!lib) {
    const char* e = dlerror();
    l.why = std::string("libfabric cannot be loaded (") + (e ? e : "libfabric.so.1 not found") +
            "); install libfabric1, or use transport.backend = \"auto\"";
    return l;
  }
  l.ok = resolve(lib, "fi_getinfo", l.api.getinfo, l.why) & resolve(lib, "fi_freeinfo", l.api.freeinfo, l.why) &
         resolve(lib, "fi_dupinfo", l.api.dupinfo, l.why) & resolve(lib, "fi_fabric", l.api.fabric, l.why) &
         resolve(lib, "fi_strerror", l.api.strerror, l.why);
  return l;  // the library stays loaded for the process's life
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const Api* api() { return loaded().ok ? &loaded().api : nullptr; }
const std::string& why() { return loaded().why; }

}  // namespace tandem::mpi::fabric
