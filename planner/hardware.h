// What a worker's accelerator can do, for the simulator's roofline: peak
// dense bf16 FLOP/s, HBM bandwidth and size, and the link KV travels over.
//
// Built-in profiles hold the vendors' datasheet figures (dense, no sparsity):
//   H100 SXM5: 989 TFLOP/s bf16, 3.35 TB/s HBM3, 80 GB; NVLink 4 450 GB/s per direction
//   H200 SXM:  989 TFLOP/s bf16, 4.8 TB/s HBM3e, 141 GB; NVLink 4 450 GB/s per direction
//   B200 (HGX): 2.25 PFLOP/s bf16, 8 TB/s HBM3e, 180 GB; NVLink 5 900 GB/s per direction
//   host link (all three): PCIe Gen5 x16, 128 GB/s both ways: 64 GB/s per direction
// (NVIDIA H100 and H200 Tensor Core GPU datasheets; NVIDIA HGX B200 specifications.)
// What a real step achieves of those peaks (mfu, mbu) and a fixed cost per
// step (kernel launches, scheduling) are not datasheet figures: the defaults
// below are assumptions, named as such, and a TOML profile — or one fitted
// from a job's own measurements (tandem's CPU workers) — replaces them.
#pragma once

#include <filesystem>
#include <string>

namespace tandem::planner {

struct HardwareProfile {
  std::string name;
  double peak_flops = 0;        // dense bf16 (or the worker's compute type), FLOP/s
  double hbm_bytes_per_s = 0;   // memory bandwidth
  double hbm_bytes = 0;         // memory size (weights + KV must fit)
  double link_bytes_per_s = 0;  // KV transfer between workers, per direction
  double link_latency_s = 0;    // per transfer
  double mfu = 0.6;             // achieved share of peak_flops in large matrix products
  double mbu = 0.8;             // achieved share of hbm_bytes_per_s when streaming weights and KV
  double step_overhead_s = 0;   // fixed cost of one engine step, seconds
  double kv_memory_fraction = 0.9;  // share of memory left after weights that holds KV
  // Weights copied in from the host when a re-split regroups a worker's GPUs
  // at another tensor-parallel width (each GPU its new shard, all at once).
  double reload_bytes_per_s = 32e9;

  // "h100", "h200", "b200" or a TOML file with the same keys; throws tandem::Error.
  static HardwareProfile named(const std::string& name_or_file);
  // The built-in profile ("h100", "h200", "b200") for a CUDA device name such
  // as "NVIDIA H100 80GB HBM3"; "" when there is none.
  static std::string builtin_for_device(const std::string& device_name);
  static HardwareProfile from_toml(const std::filesystem::path& file);
};

}  // namespace tandem::planner
