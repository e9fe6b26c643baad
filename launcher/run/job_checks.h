// What a job needs, decided and checked before any rank starts work: the
// prepared config and model, rank 0's file checks, each worker's backend
// check, the KV layout and pool size, and the prefill/decode split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/kv_layout.h"
#include "launcher/config/config.h"
#include "router/body_defaults.h"
#include "router/input_scan.h"
#include "runtime/model/model_config.h"
#include "runtime/tokenizer/tokenizer.h"
#include "topology/roles.h"

namespace tandem::launcher {

// Everything a rank needs to start, checked before any rank starts work.
struct Prepared {
  Config cfg;
  runtime::ModelConfig model;
  std::unique_ptr<runtime::Tokenizer> tokenizer;
  int64_t max_model_len = 0;
  int64_t max_line_bytes = 0;  // job.max_line_bytes, or derived from max_model_len
  // Rank 0 of `tandem run`: what check_files read of the input (null: it
  // needed no reading through; router/input_scan.h).
  std::shared_ptr<const router::InputScan> input_scan;
  // [defaults] / --defaults, checked (router/body_defaults.h); null: none.
  std::shared_ptr<const router::BodyDefaults> defaults;
};

// Rank 0's checks of what only it touches: input, output, summary, and that
// the weights map; the input read through where it must be (compressed, or
// resuming: router/input_scan.h), its result kept in p.input_scan. Throws
// tandem::Error (one line).
void check_files(Prepared& p);
// model.backend on a worker: built, with a device, and with what this job asks
// of it. Throws tandem::Error (one line).
void check_backend(const Prepared& p, int ranks);
// model.cpu_matmul's kernels chosen for this process (f32, bf16, bf16-amx, int8), for model m at `path`, loaded
// as model.dtype `load_as` ("": as the checkpoint is, no conversion offered). Throws tandem::Error (one line)
// where the CPU or the model cannot take them.
void use_cpu_matmul(const std::string& choice, const runtime::ModelConfig& m, const std::string& path,
                    const std::string& load_as);
// kv.dtype resolved to a KV element's bytes (4 f32, 2 bf16, 1 FP8). auto: on a
// GPU bf16 unless the checkpoint is f32; on the CPU bf16 under model.cpu_matmul
// = "bf16-amx" (its attention reads every KV element rounded to bf16: the same
// bits from half the bytes; head_dim even), else f32 (the reference).
int64_t kv_elem_bytes(const std::string& kv_dtype, bool on_cpu, const std::string& cpu_matmul,
                      const runtime::ModelConfig& m);
// A worker rank's KV layout: kv.dtype resolved (kv_elem_bytes), and the KV heads
// it holds as one of a tensor-parallel group of `tp` ranks.
kv::KvLayout kv_layout(const Prepared& p, int tp = 1);
// KV blocks for one worker rank: kv.memory_gib, or room for max_num_seqs
// full contexts (its shard of them, in a group of `tp`), capped at 60% of the
// memory this node's ranks could share. Throws tandem::Error for a
// kv.memory_gib beyond the node's memory.
int64_t pool_blocks(const Prepared& p, int local_ranks, int tp = 1);
// The bytes a worker rank of a GPU backend has for its KV pool at width `tp`:
// 90% of the device's `free` bytes less its shard of the checkpoint's
// `weights` bytes (the embedding and LM head whole), a step's buffers and 1 GiB.
double device_pool_room(const Prepared& p, double weights, double free, int tp);
// A cell's pool, in bytes, where it regroups between widths a and b (its
// memory is registered once, its blocks laid out again at each regroup):
// within both forms' room (on a GPU, the narrower form's larger shard of the
// weights leaves less): topology::cell_pool_bytes's rule, for this job and node.
uint64_t cell_pool_bytes(const Prepared& p, int local_ranks, int tp_a, int tp_b);

// What job.mode and [cluster] ask of the split (topology/roles.h decides it).
topology::Ask split_ask(const Config& cfg);
// Why the model or this job cannot run at these tensor-parallel widths ("" when it can).
std::string tp_problem(const Prepared& p, const topology::Roles& roles);

}  // namespace tandem::launcher
