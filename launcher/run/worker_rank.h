// A worker rank of an MPI job: its parts (weights, pool, transport, groups,
// model), loaded in phases every rank agrees on, and its loop: the worker
// service reached through the MPI port, or a follower of its
// tensor-parallel group's leader (runtime/service/group_worker.h).
#pragma once

#include <memory>

#include "kv/block_pool.h"
#include "kv/tiers.h"
#include "launcher/run/job_checks.h"
#include "launcher/run/layout.h"
#include "mpi_transport/kv_transport.h"
#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_tp_group.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/engine/backend.h"
#include "runtime/engine/device_group.h"
#include "runtime/model/weights.h"
#include "runtime/service/worker_core.h"

namespace tandem::launcher {

// A KV transport, closed collectively as its owner goes, unless an exception
// unwinds (the job then ends with MPI_Abort: no collective may wait).
struct TransportCloser {
  void operator()(mpi::KvTransport* t) const;
};

// A worker rank's parts, in the order they are made; they go in the reverse one.
struct WorkerParts {
  std::unique_ptr<runtime::ModelWeights> weights;
  std::unique_ptr<runtime::cpu::ThreadPool> threads;
  std::unique_ptr<mpi::KvTransport, TransportCloser> transport;
  std::shared_ptr<void> device_pool;  // the KV pool's device memory (non-CPU backends, no transport)
  float* pool_base = nullptr;   // the KV pool's memory where the transport allocated it
  uint64_t pool_capacity = 0;   // its bytes, where a regroup relays it out (Layout::regroups)
  std::unique_ptr<kv::BlockPool> pool;
  std::unique_ptr<kv::KvTiers> tiers;
  std::unique_ptr<mpi::MpiTpGroup> group;  // tensor-parallel: the group's exchange (host memory)
  std::unique_ptr<runtime::DeviceGroup> device_group;  // and on the GPUs (NCCL), for a GPU backend
  std::unique_ptr<runtime::DeviceGroup> other_device_group;  // a cell's rank: its other form's (Layout::regroups)
  std::unique_ptr<runtime::ModelBackend> model;  // this rank's shard of the model
};

// A worker loads in phases, every rank learning after each whether any
// worker failed: one that failed alone would otherwise leave the others in
// the transport's collective calls and rank 0 waiting for it to report
// loaded, a job hung without a word. False (the verdict printed once) when one did.
bool load_worker(const mpi::MpiEnv& env, const Prepared& p, const Layout& l, const Node& node, WorkerParts& w);

// The engine over this rank's model (the leader's wrapper, in a group).
std::unique_ptr<service::WorkerCore> make_core(int rank, const Prepared& p, const Layout& l, WorkerParts& w,
                                               std::unique_ptr<runtime::ModelBackend> model);

// A worker rank under MPI: its service, reached through the MPI port, until
// rank 0 says stop; in a tensor-parallel group the leader's service tells the
// followers what to run (runtime/service/group_worker.h).
void run_worker(const mpi::MpiEnv& env, const Prepared& p, Layout& l, WorkerParts& w, mpi::Mailbox& box);

}  // namespace tandem::launcher
