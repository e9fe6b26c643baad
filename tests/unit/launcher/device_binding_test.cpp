#include <catch2/catch.hpp>

#include "launcher/run/device_binding.h"

using tandem::launcher::shared_device_error;
using tandem::launcher::worker_device_index;

TEST_CASE("the n-th worker of a node takes its n-th GPU; rank 0's node shifts by one", "[devices]") {
  // `-N2 -n17`: node 0 holds rank 0 and 8 workers, node 1 holds 8 workers.
  CHECK(tandem::launcher::workers_on_node(9, true) == 8);
  CHECK(tandem::launcher::workers_on_node(8, false) == 8);
  for (int r = 1; r < 9; ++r) CHECK(worker_device_index(r, true) == r - 1);
  for (int r = 0; r < 8; ++r) CHECK(worker_device_index(r, false) == r);
}

TEST_CASE("two workers on one GPU are refused with one line naming both", "[devices]") {
  // All GPUs visible, one per worker: fine.
  const std::vector<int> ranks = {0, 1, 2, 3};
  CHECK(shared_device_error(2, ranks, {"", "GPU-a", "GPU-b", "GPU-c"}).empty());
  // One GPU per task (each sees only its own, index 0): distinct UUIDs, fine.
  CHECK(shared_device_error(3, ranks, {"", "GPU-x", "GPU-y", "GPU-z"}).empty());
  // Three workers, two visible GPUs: index % 2 gives worker 3 the GPU of worker 1.
  const auto e = shared_device_error(3, ranks, {"", "GPU-a", "GPU-b", "GPU-a"});
  CHECK(e.find("worker ranks 1 and 3 would share one GPU (GPU-a)") == 0);
  CHECK(shared_device_error(1, ranks, {"", "GPU-a", "GPU-b", "GPU-a"}).find("worker ranks 1 and 3") == 0);
  CHECK(shared_device_error(2, ranks, {"", "GPU-a", "GPU-b", "GPU-a"}).empty());
  // Rank 0 (no device) never conflicts.
  CHECK(shared_device_error(0, ranks, {"", "GPU-a", "GPU-b", "GPU-a"}).empty());
}
