// The typed configuration of a Tandem job: one struct per TOML section.
//
// Defaults here are the documented defaults (docs/config.md is generated from
// the schema in schema.cpp, and a unit test keeps the two equal). Values are
// validated when loaded (load.h); code that receives a Config may trust them.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::launcher {

struct ModelConfig {
  std::string path;                    // Hugging Face model directory
  std::string dtype = "auto";          // auto | f32 | bf16 | f16
  std::string backend = "cpu";         // cpu | cuda
  std::string chat_template = "auto";  // auto | chatml | llama3 | llama3.1 | mistral
  std::string cpu_matmul = "f32";      // f32 | bf16 | bf16-amx | int8: the CPU backend's matrix products (runtime/cpu/kernels.h)
  std::string gpu_matmul = "auto";     // auto | fp8: the CUDA backend's long products of FP8-block weights
  std::string served_name;             // empty: the model directory's name
  int64_t max_model_len = 0;           // tokens; 0: the model's max_position_embeddings
};

struct JobConfig {
  std::string mode = "disagg";  // disagg | agg | auto
  std::string input;            // OpenAI-Batch JSONL
  std::string output;           // OpenAI-Batch output JSONL (append-only)
  std::string output_order = "completion";  // completion | input
  int64_t epoch_requests = 1024;            // requests per planning epoch
  double epoch_seconds = 60.0;              // tandem serve: seconds per planning epoch
  int64_t max_num_seqs = 64;                // sequences running at once per worker
  int64_t max_batched_tokens = 2048;        // tokens per engine step per worker
  int64_t seed = 0;                         // sampling seed for requests without one
  double drain_seconds = 60.0;              // after USR1/TERM: time to finish in-flight work
  double worker_timeout_seconds = 300.0;    // a worker silent this long ends the job (0: never)
  double flush_seconds = 10.0;              // fsync output + checkpoint at least this often
  double progress_seconds = 30.0;           // a progress line this often when stderr is not a terminal
  std::string summary;                      // summary JSON; empty: <output>.summary.json
  std::string progress_file;                // progress JSON; empty: <output>.progress.json; "none": off
  bool resume = false;                      // continue an existing output (skip what its checkpoint has)
  int64_t max_line_bytes = 0;               // longest input line; 0: 64 bytes per context token, at least 1 MiB
};

struct ClusterConfig {
  int64_t prefill_ranks = 0;      // 0: derived from prefill_fraction
  int64_t decode_ranks = 0;       // 0: the workers not prefilling
  double prefill_fraction = 0.5;  // share of workers that prefill when not given as counts
  int64_t threads_per_rank = 0;   // compute threads per worker; 0: the cores Slurm/OS gives it
  int64_t tp = 1;                 // tensor-parallel width of every worker (ranks per worker)
  int64_t prefill_tp = 0;         // of a prefill worker; 0: tp
  int64_t decode_tp = 0;          // of a decode (or aggregated) worker; 0: tp
  std::string placement = "node"; // node: roles spread over the nodes, groups on one node each | rank
  bool expert_parallel = true;    // a MoE model's experts whole on a worker's ranks; false: each expert split
  int prefill_width() const { return static_cast<int>(prefill_tp > 0 ? prefill_tp : tp); }
  int decode_width() const { return static_cast<int>(decode_tp > 0 ? decode_tp : tp); }
};

struct RouterConfig {
  std::string policy = "kv_aware";   // kv_aware | round_robin | least_loaded
  int64_t local_prefill_tokens = 256;  // prompts with fewer uncached tokens prefill on their decode rank
  int64_t reorder_window = 0;        // requests looked ahead to group shared prefixes; 0: off
  int64_t tokenize_threads = -1;     // rank 0's helper threads that parse and tokenize input lines; -1: auto
  double overlap_weight_device = 1.0;
  double overlap_weight_host = 0.75;
  double overlap_weight_disk = 0.25;
  double kv_between_nodes_weight = 0.5;  // routing cost of a KV block a prefill would send to another node
};

struct PlannerConfig {
  std::string policy = "lookahead";  // static:P:D | agg | sla | lookahead | oracle
  double ttft_ms = 0.0;              // target time to first token; 0: minimise makespan
  double itl_ms = 0.0;               // target inter-token latency; 0: minimise makespan
};

struct KvConfig {
  int64_t block_size = 16;      // tokens per KV block
  std::string dtype = "auto";   // auto | f32 | bf16: the KV pool's element type
  double memory_gib = 0.0;      // KV pool per worker; 0: what is left after weights, less 10%
  double host_cache_gib = 0.0;  // host-memory tier (G2); 0: off
  std::string store_path;       // HDF5 prefix store (G3) on a shared filesystem; empty: off
  int64_t store_min_hits = 2;   // a block goes to the store after this many uses
  double store_max_gib = 100.0;  // the store stops growing past this; 0: no limit
};

struct TransportConfig {
  std::string backend = "auto";  // auto | mpi_rma | mpi_two_sided | nccl | libfabric
  std::string libfabric_provider;  // "" : the first fast one libfabric offers; "tcp;ofi_rxm", "shm", "efa", ...
};

struct HttpConfig {
  std::string host = "127.0.0.1";
  int64_t port = 8000;
  std::string api_key_env;               // env var holding the required Bearer token; empty: none
  int64_t max_body_bytes = 16 << 20;     // bytes
  int64_t max_in_flight = 256;           // requests; beyond: 429
  double drain_seconds = 30.0;           // after SIGTERM
  double head_timeout_seconds = 10.0;    // a request's head (line and headers) arrives within this, or is dropped
  std::string batch_dir = "./tandem-batches";  // the Files API's files (and batches') home
  int64_t max_file_bytes = int64_t{200} << 20;  // bytes a file upload may hold
  int64_t batch_in_flight = 0;  // batch lines in flight at once, less the interactive ones; 0: max_num_seqs per worker
};

struct LogConfig {
  std::string level = "info";  // trace | debug | info | warn | error | off
};

// The keys whose values are names from a fixed list, parsed once (when the
// config is loaded); the strings stay for printing the effective config.
enum class JobMode { kDisagg, kAgg, kAuto };
enum class ComputeBackend { kCpu, kCuda };
enum class TransportKind { kAuto, kMpiRma, kMpiTwoSided, kNccl, kLibfabric };
enum class OutputOrder { kCompletion, kInput };
enum class Placement { kNode, kRank };
struct Choices {
  JobMode mode = JobMode::kDisagg;
  ComputeBackend backend = ComputeBackend::kCpu;
  TransportKind transport = TransportKind::kAuto;
  OutputOrder output_order = OutputOrder::kCompletion;
  Placement placement = Placement::kNode;
  bool on_cpu() const { return backend == ComputeBackend::kCpu; }
};

struct Config {
  ModelConfig model;
  JobConfig job;
  ClusterConfig cluster;
  RouterConfig router;
  PlannerConfig planner;
  KvConfig kv;
  TransportConfig transport;
  HttpConfig http;
  LogConfig log;
  // [defaults]: request fields merged under every batch line's body
  // (router/body_defaults.h), as JSON text; empty: none. defaults_source
  // names where they came from, for messages.
  std::string defaults, defaults_source;
  Choices choices;  // from the strings above, by resolve_choices()
};

// Fills config.choices from its (validated) strings.
void resolve_choices(Config& config);
// A transport's name as in transport.backend.
const char* transport_name(TransportKind t);

}  // namespace tandem::launcher
