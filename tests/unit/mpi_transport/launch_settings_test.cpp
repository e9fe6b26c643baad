#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "mpi_transport/mpi_env.h"

using tandem::mpi::direct_launch_defaults;

namespace {
const char* const kNames[] = {"PMIX_RANK", "SLURM_STEP_ID", "OMPI_COMM_WORLD_SIZE", "OMPI_MCA_pmix_base_async_modex",
                              "OMPI_MCA_pmix_base_collect_data", "PMIX_MCA_gds"};

void clear() {
  for (const char* name : kNames) unsetenv(name);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "(unset)";
}
}  // namespace

TEST_CASE("started by srun directly, the safe start-up settings are set, each unless already set", "[mpi_env]") {
  clear();
  setenv("PMIX_RANK", "3", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("PMIX_MCA_gds", "ds21", 1);  // the user's choice stays
  const std::vector<std::string> set = direct_launch_defaults();
  CHECK(set == std::vector<std::string>{"OMPI_MCA_pmix_base_async_modex=1", "OMPI_MCA_pmix_base_collect_data=0"});
  CHECK(env("OMPI_MCA_pmix_base_async_modex") == "1");
  CHECK(env("OMPI_MCA_pmix_base_collect_data") == "0");
  CHECK(env("PMIX_MCA_gds") == "ds21");
  clear();
}

TEST_CASE("under mpirun, or outside Slurm, nothing is set", "[mpi_env]") {
  clear();
  setenv("PMIX_RANK", "0", 1);
  setenv("SLURM_STEP_ID", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);  // mpirun's daemons started this rank, inside an allocation
  CHECK(direct_launch_defaults().empty());
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("SLURM_STEP_ID");  // mpirun outside Slurm also sets PMIX_RANK
  CHECK(direct_launch_defaults().empty());
  CHECK(env("OMPI_MCA_pmix_base_async_modex") == "(unset)");
  CHECK(env("PMIX_MCA_gds") == "(unset)");
  clear();
}
