// libfabric's few real entry points, resolved from libfabric.so.1 the first
// time a libfabric transport opens, instead of linked: everything else the
// transport calls (fi_domain, fi_write, fi_cq_read, ...) is an inline call
// through the table of the object it acts on. Loading libfabric loads its
// providers' libraries, and Debian's PSM one (libinfinipath) calibrates a
// timer for ~200 ms in its constructor and installs signal handlers of its
// own: linked, every rank paid that at exec, for a transport most jobs never
// open. The loader keeps the process's signal handling as it was.
#pragma once

#include <rdma/fabric.h>

#include <string>

namespace tandem::mpi::fabric {

struct Api {
  int (*getinfo)(uint32_t version, const char* node, const char* service, uint64_t flags, const fi_info* hints,
                 fi_info** info);
  void (*freeinfo)(fi_info* info);
  fi_info* (*dupinfo)(const fi_info* info);  // dupinfo(nullptr) is fi_allocinfo()
  int (*fabric)(fi_fabric_attr* attr, fid_fabric** fabric, void* context);
  const char* (*strerror)(int errnum);
};

// The entry points, loaded once (thread-safe); null when libfabric cannot
// be loaded, with why() saying so in one line.
const Api* api();
const std::string& why();

}  // namespace tandem::mpi::fabric
