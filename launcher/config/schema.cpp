#include "launcher/config/schema.h"

#include <charconv>
#include <cmath>
#include <sstream>

#include "common/text.h"

namespace tandem::launcher {
namespace {

template <class T>
constexpr ValueKind kind_of() {
  if constexpr (std::is_same_v<T, bool>) return ValueKind::kBool;
  else if constexpr (std::is_same_v<T, int64_t>) return ValueKind::kInt;
  else if constexpr (std::is_same_v<T, double>) return ValueKind::kFloat;
  else return ValueKind::kString;
}

// A KeySpec bound to Config::*section .*member, configured by chained calls.
struct Key {
  KeySpec spec;
  Key& doc(std::string d) { spec.doc = std::move(d); return *this; }
  Key& choices(std::vector<std::string> c) { spec.choices = std::move(c); return *this; }
  Key& at_least(double v) { spec.min = v; return *this; }
  Key& at_most(double v) { spec.max = v; return *this; }
  Key& check(std::function<std::string(std::string_view)> f) { spec.check = std::move(f); return *this; }
  Key& pending(std::string feature) { spec.pending = std::move(feature); return *this; }
};

template <class S, class T>
Key key(std::string section, std::string name, S Config::*sec, T S::*member) {
  Key k;
  k.spec.section = std::move(section);
  k.spec.name = std::move(name);
  k.spec.kind = kind_of<T>();
  k.spec.set = [sec, member](Config& c, const Value& v) { (c.*sec).*member = std::get<T>(v); };
  k.spec.get = [sec, member](const Config& c) { return Value((c.*sec).*member); };
  return k;
}

std::string check_planner_policy(std::string_view p) {
  if (p == "agg" || p == "sla" || p == "lookahead" || p == "oracle") return "";
  if (p.starts_with("static:")) {
    auto rest = p.substr(7);
    auto colon = rest.find(':');
    auto positive = [](std::string_view s) {
      int64_t v = 0;
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      return ec == std::errc() && ptr == s.data() + s.size() && v > 0;
    };
    if (colon != std::string_view::npos && positive(rest.substr(0, colon)) &&
        positive(rest.substr(colon + 1)))
      return "";
    return "must be static:P:D with positive rank counts, e.g. \"static:2:6\"";
  }
  return "must be one of \"lookahead\", \"sla\", \"agg\", \"oracle\" or \"static:P:D\"";
}

std::vector<KeySpec> build_schema() {
  using C = Config;
  const std::string kRun = "tandem run";
  std::vector<Key> keys = {
      // [model]
      key("model", "path", &C::model, &ModelConfig::path)
          .doc("Hugging Face model directory: config.json, *.safetensors, tokenizer.json.")
          ,
      key("model", "dtype", &C::model, &ModelConfig::dtype)
          .choices({"auto", "f32", "bf16", "f16", "fp8", "int8"})
          .doc("How the CPU backend holds the weights: auto as the checkpoint stores them; f32, bf16 or f16 every "
               "matrix converted as it loads (rounded to nearest even); fp8 or int8 the linear layers quantized as "
               "they load, as `tandem quantize --scheme fp8-block | int8-channel` writes them (half of bf16's memory "
               "and bytes per decode step; docs/quantization.md). Each rank converts the whole model, then keeps "
               "its shard.")
          ,
      key("model", "backend", &C::model, &ModelConfig::backend)
          .choices({"cpu", "cuda"})
          .doc("Compute backend of the worker ranks.")
          ,
      key("model", "chat_template", &C::model, &ModelConfig::chat_template)
          .choices({"auto", "chatml", "llama3", "llama3.1", "mistral"})
          .doc("Chat format for `messages`; auto recognises the model's own template.")
          ,
      key("model", "cpu_matmul", &C::model, &ModelConfig::cpu_matmul)
          .choices({"f32", "bf16", "bf16-amx", "int8"})
          .doc("The CPU backend's matrix products: f32 (FP32 FMAs on exactly widened weights, the same bits on every "
               "CPU), bf16 (activations rounded to bf16, AVX512-BF16 dot products: about 1.7x the prefill on Zen 4, other "
               "bits; docs/engine.md), bf16-amx (activations rounded to bf16, the sums in the order of AMX's tiles, "
               "attention on the tiles too: about 3x the prefill of bf16 and FP8 checkpoints on Xeons since Sapphire "
               "Rapids, more for long prompts, the same bits on any CPU with AVX512-BF16 and VBMI) or int8 (INT8 checkpoints: activations quantized per token, "
               "AVX512-VNNI integer products, the W8A8 recipe; docs/quantization.md).")
          ,
      key("model", "gpu_matmul", &C::model, &ModelConfig::gpu_matmul)
          .choices({"auto", "fp8"})
          .doc("The CUDA backend's products of an FP8 128x128-block checkpoint over 64 rows or more (prefill): auto "
               "(the weights' values rounded to bf16 on the tensor cores, activations in bf16) or fp8 (Hopper's FP8 "
               "tensor cores through cuBLASLt, activations quantized to E4M3 per row and 128 columns as vLLM and "
               "SGLang serve such checkpoints: other numerics; docs/quantization.md).")
          ,
      key("model", "served_name", &C::model, &ModelConfig::served_name)
          .doc("Model name in API responses and /v1/models; empty: the model directory's name.")
          ,
      key("model", "max_model_len", &C::model, &ModelConfig::max_model_len)
          .at_least(0)
          .doc("Longest prompt plus completion, in tokens; 0: the model's max_position_embeddings.")
          ,
      // [job]
      key("job", "mode", &C::job, &JobConfig::mode)
          .choices({"disagg", "agg", "auto"})
          .doc("disagg: separate prefill and decode ranks ([cluster] sets the split); agg: every worker "
               "does both (the baseline); auto: the planner (planner.policy) chooses the split, or agg, "
               "for each epoch (job.epoch_requests input lines in tandem run, job.epoch_seconds in serve).")
          ,
      key("job", "input", &C::job, &JobConfig::input)
          .doc("Input file, OpenAI-Batch JSONL.")
          ,
      key("job", "output", &C::job, &JobConfig::output)
          .doc("Output file, OpenAI-Batch output JSONL, appended to.")
          ,
      key("job", "output_order", &C::job, &JobConfig::output_order)
          .choices({"completion", "input"})
          .doc("completion: write each result when it is done; input: keep the input's order.")
          ,
      key("job", "epoch_requests", &C::job, &JobConfig::epoch_requests)
          .at_least(1)
          .doc("Input lines per planning epoch (job.mode = \"auto\"): the planner reads each epoch "
               "ahead and may re-split the ranks before it.")
          ,
      key("job", "epoch_seconds", &C::job, &JobConfig::epoch_seconds)
          .at_least(0.1)
          .doc("tandem serve with job.mode = \"auto\": seconds per planning epoch; the planner sizes the "
               "next epoch from the requests of the last one (a server cannot see ahead).")
          ,
      key("job", "max_num_seqs", &C::job, &JobConfig::max_num_seqs)
          .at_least(1).at_most(65536)
          .doc("Sequences running at once on one worker.")
          ,
      key("job", "max_batched_tokens", &C::job, &JobConfig::max_batched_tokens)
          .at_least(1)
          .doc("Token budget of one engine step on one worker (prefill chunks plus decode tokens).")
          ,
      key("job", "seed", &C::job, &JobConfig::seed)
          .at_least(0)
          .doc("Sampling seed for requests that carry none.")
          ,
      key("job", "drain_seconds", &C::job, &JobConfig::drain_seconds)
          .at_least(0)
          .doc("After USR1 or TERM, seconds to let in-flight requests finish before exiting.")
          ,
      key("job", "worker_timeout_seconds", &C::job, &JobConfig::worker_timeout_seconds)
          .at_least(0)
          .doc("A worker that has loaded and then sends nothing for this many seconds (workers report twice a "
               "second while they run, between engine steps; never less than 4 of its longest step so far) is lost: "
               "a node down or unreachable, or a hang. Rank 0 commits the output and ends the job with one line naming "
               "the rank and its node; rerun with --resume. The other way too: rank 0 pings the workers a quarter "
               "of it apart, and a worker that hears nothing from rank 0 for this long (its node cut off) ends "
               "itself. 0: wait for ever.")
          ,
      key("job", "flush_seconds", &C::job, &JobConfig::flush_seconds)
          .at_least(0.01)
          .doc("Output and checkpoint are fsync'd at least this often, in seconds.")
          ,
      key("job", "progress_seconds", &C::job, &JobConfig::progress_seconds)
          .at_least(0.1)
          .doc("When stderr is not a terminal (a Slurm log), one progress line this often, in seconds."),
      key("job", "summary", &C::job, &JobConfig::summary)
          .doc("Where the job's summary JSON goes; empty: next to the output as <output>.summary.json."),
      key("job", "progress_file", &C::job, &JobConfig::progress_file)
          .doc("A JSON file with the progress line's figures (state, done, failed, to_do, rates, eta_s), replaced "
               "whole at every progress line and at the end, for scripts to read at any time; empty: next to the output "
               "as <output>.progress.json; \"none\": not written."),
      key("job", "resume", &C::job, &JobConfig::resume)
          .doc("Continue an existing output: skip what its checkpoint (<output>.ckpt) records as done. "
               "Also --resume; automatic when Slurm requeues the job. Off: an existing output is an error.")
          ,
      key("job", "max_line_bytes", &C::job, &JobConfig::max_line_bytes)
          .at_least(0)
          .doc("Longest input line, in bytes; a longer one becomes an error record (its custom_id kept when it "
               "comes first) and is skipped without being held in memory. 0: 64 bytes per token of the "
               "context (model.max_model_len), at least 1 MiB.")
          ,
      // [cluster]
      key("cluster", "prefill_ranks", &C::cluster, &ClusterConfig::prefill_ranks)
          .at_least(0)
          .doc("Worker ranks that prefill; 0: derived from prefill_fraction.")
          ,
      key("cluster", "decode_ranks", &C::cluster, &ClusterConfig::decode_ranks)
          .at_least(0)
          .doc("Worker ranks that decode; 0: every worker that does not prefill.")
          ,
      key("cluster", "placement", &C::cluster, &ClusterConfig::placement)
          .choices({"node", "rank"})
          .doc("Over several nodes, which ranks do what. node: each node gets prefill and decode workers in "
               "the job's proportion (a prompt's KV then stays on its node: router.kv_between_nodes_weight) and "
               "each tensor-parallel worker's ranks share a node; rank: ranks 1..prefill_ranks prefill, the rest "
               "decode, each worker's ranks still on one node where they can be. A heterogeneous Slurm job "
               "always places by rank (its components choose the roles).")
          ,
      key("cluster", "prefill_fraction", &C::cluster, &ClusterConfig::prefill_fraction)
          .at_least(0).at_most(1)
          .doc("Share of the workers that prefill when counts are not given.")
          ,
      key("cluster", "threads_per_rank", &C::cluster, &ClusterConfig::threads_per_rank)
          .at_least(0)
          .doc("Compute threads per worker rank; 0: the CPUs the rank may run on.")
          ,
      key("cluster", "tp", &C::cluster, &ClusterConfig::tp)
          .at_least(1).at_most(8)
          .doc("Tensor-parallel width: the ranks that run one worker (1, 2, 4 or 8, dividing the model's "
               "attention heads). prefill_ranks and decode_ranks still count ranks. See docs/engine.md.")
          ,
      key("cluster", "prefill_tp", &C::cluster, &ClusterConfig::prefill_tp)
          .at_least(0).at_most(8)
          .doc("Tensor-parallel width of a prefill worker; 0: tp. Under job.mode = \"auto\" a width other than "
               "decode_tp makes the workers cells of lcm(prefill_tp, decode_tp) ranks that the planner moves between "
               "prefill and decode workers, regrouping them (docs/engine.md).")
          ,
      key("cluster", "decode_tp", &C::cluster, &ClusterConfig::decode_tp)
          .at_least(0).at_most(8)
          .doc("Tensor-parallel width of a decode worker (of every worker when aggregated); 0: tp.")
          ,
      key("cluster", "expert_parallel", &C::cluster, &ClusterConfig::expert_parallel)
          .doc("A mixture-of-experts model in a worker of two or more ranks: true gives each rank whole experts "
               "(experts / width of them; the width must divide the experts) and sends each row's expert outputs "
               "to the rank that combines it; false splits every expert across the ranks as a dense MLP is. "
               "The outputs are the same bits either way (docs/engine.md).")
          ,
      // [router]
      key("router", "policy", &C::router, &RouterConfig::policy)
          .choices({"kv_aware", "round_robin", "least_loaded"})
          .doc("How rank 0 picks a decode rank for a request.")
          ,
      key("router", "local_prefill_tokens", &C::router, &RouterConfig::local_prefill_tokens)
          .at_least(0)
          .doc("Prompts with fewer uncached tokens than this prefill on their decode rank; 0: never.")
          ,
      key("router", "reorder_window", &C::router, &RouterConfig::reorder_window)
          .at_least(0)
          .doc("Upcoming input lines searched for a prompt sharing the last placed one's prefix, so requests with a common "
               "prefix are placed together and it is computed once; 0: input order.")
          ,
      key("router", "tokenize_threads", &C::router, &RouterConfig::tokenize_threads)
          .at_least(-1).at_most(256)
          .doc("Helper threads on rank 0 that parse and tokenize input lines ahead of placing them (tandem run); 0: "
               "the main thread does it; -1: the CPUs rank 0 may run on less one, at most 8 (0 below 3 CPUs).")
          ,
      key("router", "overlap_weight_device", &C::router, &RouterConfig::overlap_weight_device)
          .at_least(0)
          .doc("Routing value of a prefix block cached in a worker's pool.")
          ,
      key("router", "overlap_weight_host", &C::router, &RouterConfig::overlap_weight_host)
          .at_least(0)
          .doc("Routing value of a prefix block in host memory (G2).")
          ,
      key("router", "overlap_weight_disk", &C::router, &RouterConfig::overlap_weight_disk)
          .at_least(0)
          .doc("Routing value of a prefix block in the HDF5 store (G3).")
          ,
      key("router", "kv_between_nodes_weight", &C::router, &RouterConfig::kv_between_nodes_weight)
          .at_least(0)
          .doc("Disaggregated, over several nodes: what a KV block sent over the network costs, in blocks of "
               "prefill work, when the router picks a prefill worker; one on the request's decode worker's node "
               "sends none. 0: nodes do not matter (a fabric as fast as the node).")
          ,
      // [planner]
      key("planner", "policy", &C::planner, &PlannerConfig::policy)
          .check(check_planner_policy)
          .doc("lookahead (sizes pools for the next epoch's known lengths), sla, agg, or static:P:D "
               "(oracle: tandem simulate only).")
          ,
      key("planner", "ttft_ms", &C::planner, &PlannerConfig::ttft_ms)
          .at_least(0)
          .doc("Time-to-first-token target in ms; 0: minimise the epoch's makespan.")
          ,
      key("planner", "itl_ms", &C::planner, &PlannerConfig::itl_ms)
          .at_least(0)
          .doc("Inter-token latency target in ms; 0: minimise the epoch's makespan.")
          ,
      // [kv]
      key("kv", "block_size", &C::kv, &KvConfig::block_size)
          .at_least(1).at_most(1024)
          .doc("Tokens per KV block: the unit of allocation, transfer, hashing and offload.")
          ,
      key("kv", "dtype", &C::kv, &KvConfig::dtype)
          .choices({"auto", "f32", "bf16", "fp8"})
          .doc("The KV pool's element type. bf16 holds twice the tokens of f32 in the same memory and halves every KV "
               "transfer and offload; its outputs differ from f32's at rounding level (still reproducible). fp8: "
               "E4M3 with a float32 scale per token and head (1 + 4/head_dim bytes a value: 3.9x the tokens of f32 at head_dim 128); its outputs differ "
               "more (docs/quantization.md measures it), still reproducible and the same across splits and widths. "
               "auto: on the CPU f32 (the reference), or bf16 under model.cpu_matmul = \"bf16-amx\" with an even head_dim "
               "(its attention reads KV rounded to bf16 whatever the pool holds: the same bits from half the memory); "
               "on a GPU bf16 for bf16/f16 checkpoints and f32 for f32 ones.")
          ,
      key("kv", "memory_gib", &C::kv, &KvConfig::memory_gib)
          .at_least(0)
          .doc("KV pool per worker in GiB; 0: the memory left after the weights, less 10%.")
          ,
      key("kv", "host_cache_gib", &C::kv, &KvConfig::host_cache_gib)
          .at_least(0)
          .doc("Host-memory tier (G2) per worker for blocks evicted from its pool, in GiB; 0: off.")
          ,
      key("kv", "store_path", &C::kv, &KvConfig::store_path)
          .doc("Directory of the persistent HDF5 prefix store (G3) on a shared filesystem, reused by later "
               "jobs of the same model; empty: off.")
          ,
      key("kv", "store_min_hits", &C::kv, &KvConfig::store_min_hits)
          .at_least(1)
          .doc("A block is written to the store once it has served this many prompts (its computation counts); "
               "1 stores every full block, for reruns of the same input.")
          ,
      key("kv", "store_max_gib", &C::kv, &KvConfig::store_max_gib)
          .at_least(0)
          .doc("Size of the store in GiB: past it, whole files go, least recently used (read or written) first, "
               "down to 90%; 0: no limit.")
          ,
      // [transport]
      key("transport", "backend", &C::transport, &TransportConfig::backend)
          .choices({"auto", "mpi_rma", "mpi_two_sided", "nccl", "libfabric"})
          .doc("How KV blocks move from prefill to decode ranks. auto: MPI one-sided RMA, or two-sided "
               "MPI where no window can be created (said in one log line); with `model.backend = \"cuda\"`, "
               "NCCL where built (and prefill and decode share one tensor-parallel width), else two-sided MPI "
               "staged through page-locked host buffers (docs/gpu.md). "
               "mpi_rma is refused with cuda. libfabric: fi_write between registered pools (EFA, "
               "tcp;ofi_rxm, shm; transport.libfabric_provider), CPU pools only.")
          ,
      key("transport", "libfabric_provider", &C::transport, &TransportConfig::libfabric_provider)
          .doc("With `backend = \"libfabric\"`: the provider, e.g. \"efa\", \"tcp;ofi_rxm\", \"shm\" (one node); empty: "
               "the first libfabric offers that reaches other nodes (not shm, sockets or udp).")
          ,
      // [http]
      key("http", "host", &C::http, &HttpConfig::host)
          .doc("Address the HTTP shim binds; keep 127.0.0.1 and tunnel over SSH.")
          ,
      key("http", "port", &C::http, &HttpConfig::port)
          .at_least(1).at_most(65535)
          .doc("TCP port of the HTTP shim.")
          ,
      key("http", "api_key_env", &C::http, &HttpConfig::api_key_env)
          .doc("Environment variable whose value clients must send as a Bearer token; empty: none.")
          ,
      key("http", "max_body_bytes", &C::http, &HttpConfig::max_body_bytes)
          .at_least(1024)
          .doc("Largest request body accepted, in bytes (a chunked body too: 413 once past it).")
          ,
      key("http", "head_timeout_seconds", &C::http, &HttpConfig::head_timeout_seconds)
          .at_least(0.5)
          .doc("A request's head (request line and headers) must arrive within this many seconds, or its "
               "connection is closed; and only a few heads may still be arriving a tenth of a second after their "
               "first byte (clients trickling headers cannot hold the server's threads).")
          ,
      key("http", "max_in_flight", &C::http, &HttpConfig::max_in_flight)
          .at_least(1).at_most(1000)
          .doc("Requests in flight at once (each holds one HTTP thread of rank 0); more get 429 with "
               "Retry-After.")
          ,
      key("http", "batch_dir", &C::http, &HttpConfig::batch_dir)
          .doc("Folder where `tandem serve` keeps the OpenAI Files API's files (files/) and the Batches API's "
               "batches (batches/: their state and, while they run, their resumable output); made when first "
               "needed, kept after the job. A serve started again on the same folder resumes its unfinished "
               "batches.")
          ,
      key("http", "batch_in_flight", &C::http, &HttpConfig::batch_in_flight)
          .at_least(0)
          .doc("Batch lines (`POST /v1/batches`) in flight at once, less the interactive requests in flight "
               "(interactive first); 0: job.max_num_seqs per worker rank.")
          ,
      key("http", "max_file_bytes", &C::http, &HttpConfig::max_file_bytes)
          .at_least(1024)
          .doc("Largest file `POST /v1/files` accepts, in bytes (streamed to disk; 413 once past it).")
          ,
      key("http", "drain_seconds", &C::http, &HttpConfig::drain_seconds)
          .at_least(0)
          .doc("After SIGTERM (or USR1, or Ctrl-C), seconds to finish in-flight requests before exiting; "
               "what is left is cancelled.")
          ,
      // [log]
      key("log", "level", &C::log, &LogConfig::level)
          .choices({"trace", "debug", "info", "warn", "error", "off"})
          .doc("Log level of every rank; TANDEM_LOG_LEVEL in the environment wins over it."),
  };
  std::vector<KeySpec> out;
  out.reserve(keys.size());
  for (auto& k : keys) out.push_back(std::move(k.spec));
  return out;
}

std::string format_number(double v) {
  std::ostringstream os;
  os << v;
  std::string s = os.str();
  if (s.find_first_of(".eE") == std::string::npos && std::isfinite(v)) s += ".0";
  return s;
}

}  // namespace

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> specs = build_schema();
  return specs;
}

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& s : schema())
      if (n.empty() || n.back() != s.section) n.push_back(s.section);
    return n;
  }();
  return names;
}

std::vector<std::string> key_names(std::string_view section) {
  std::vector<std::string> n;
  for (const auto& s : schema())
    if (s.section == section) n.push_back(s.name);
  return n;
}

const KeySpec* find_key(std::string_view section, std::string_view name) {
  for (const auto& s : schema())
    if (s.section == section && s.name == name) return &s;
  return nullptr;
}

std::string_view kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::kBool: return "a boolean (true or false)";
    case ValueKind::kInt: return "an integer";
    case ValueKind::kFloat: return "a number";
    case ValueKind::kString: return "a string";
  }
  return "a value";
}

std::string format_value(const Value& value) {
  struct {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return format_number(d); }
    std::string operator()(const std::string& s) const {
      std::string out = "\"";
      for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
      }
      return out + "\"";
    }
  } fmt;
  return std::visit(fmt, value);
}

std::string check_value(const KeySpec& spec, const Value& value) {
  if (const auto* s = std::get_if<std::string>(&value)) {
    if (!spec.choices.empty()) {
      for (const auto& c : spec.choices)
        if (c == *s) return "";
      std::string list;
      for (const auto& c : spec.choices) list += (list.empty() ? "" : ", ") + format_value(c);
      std::string msg = "must be one of " + list + ", got " + format_value(*s);
      if (auto near = closest_match(*s, spec.choices)) msg += "; did you mean " + format_value(*near) + "?";
      return msg;
    }
    if (spec.check) {
      if (auto why = spec.check(*s); !why.empty()) return why + ", got " + format_value(*s);
    }
    return "";
  }
  double v = 0;
  if (const auto* i = std::get_if<int64_t>(&value)) v = static_cast<double>(*i);
  else if (const auto* d = std::get_if<double>(&value)) v = *d;
  else return "";
  auto bound = [&](double b) {
    return spec.kind == ValueKind::kInt ? std::to_string(static_cast<int64_t>(b)) : format_number(b);
  };
  if (!std::isfinite(v)) return "must be a finite number, got " + format_value(value);
  if (spec.min && spec.max && (v < *spec.min || v > *spec.max))
    return "must be between " + bound(*spec.min) + " and " + bound(*spec.max) + ", got " + format_value(value);
  if (spec.min && v < *spec.min) return "must be at least " + bound(*spec.min) + ", got " + format_value(value);
  if (spec.max && v > *spec.max) return "must be at most " + bound(*spec.max) + ", got " + format_value(value);
  return "";
}

}  // namespace tandem::launcher
