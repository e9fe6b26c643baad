#include "planner/hardware.h"

#include <cctype>

#include <toml++/toml.h>

#include "common/error.h"

namespace tandem::planner {
namespace {

// Efficiencies are published measurements, not tuned (see docs/planner.md, "Where the figures come from"):
//  - mfu: best-shape bf16 matmul ("Maximum Achievable Matmul FLOPS" table, S. Bekman, ML Engineering,
//    compute/accelerator/README.md): H100 SXM 794.5 of 989 TFLOP/s = 0.80 ("H200 is the same"),
//    B200 1745 of 2250 = 0.776. FlashAttention-3 (arXiv 2407.08608) reaches 0.75 on H100 attention.
//  - mbu: 0.78 of HBM bandwidth for a whole Llama-3.2-1B batch-1 forward pass on H100 (Hazy Research,
//    "Look Ma, No Bubbles!", 2025-05-27); a device copy reaches 0.867. No H200/B200 figure was found:
//    the H100 one is used for them.
//  - step_overhead_s: 0.5 ms, derived from the same blog: vLLM/SGLang reach at most 50% of bandwidth on
//    that model's 0.74 ms step where the fused kernel reaches 78%, leaving ~0.5 ms per step of kernel
//    boundaries and launches (vLLM before multi-step scheduling had ~4 ms: vllm-project/vllm#6854).
//  - reload_bytes_per_s: 32 GB/s, an assumption: half of PCIe Gen5 x16's 64 GB/s per direction (the
//    checkpoint read from the host's page cache through pageable buffers); no published figure found.
HardwareProfile builtin(const std::string& name, double tflops, double tbps, double gb, double link_gbps,
                        double mfu) {
  HardwareProfile h;
  h.mfu = mfu;
  h.mbu = 0.78;
  h.name = name;
  h.peak_flops = tflops * 1e12;
  h.hbm_bytes_per_s = tbps * 1e12;
  h.hbm_bytes = gb * 1e9;
  h.link_bytes_per_s = link_gbps * 1e9;
  h.link_latency_s = 10e-6;
  h.step_overhead_s = 0.5e-3;
  return h;
}

}  // namespace

HardwareProfile HardwareProfile::named(const std::string& n) {
  if (n == "h100") return builtin("h100", 989, 3.35, 80, 450, 0.80);
  if (n == "h200") return builtin("h200", 989, 4.8, 141, 450, 0.80);
  if (n == "b200") return builtin("b200", 2250, 8.0, 180, 900, 0.776);
  if (std::filesystem::exists(n)) return from_toml(n);
  throw Error("unknown hardware '" + n + "': use h100, h200, b200 or a TOML profile file");
}

std::string HardwareProfile::builtin_for_device(const std::string& device_name) {
  std::string upper = device_name;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const char* model : {"H100", "H200", "B200"})
    if (upper.find(model) != std::string::npos) {
      std::string key = model;
      key[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(key[0])));
      return key;
    }
  return "";
}

HardwareProfile HardwareProfile::from_toml(const std::filesystem::path& file) {
  toml::table t;
  try {
    t = toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    throw Error(file.string() + ":" + std::to_string(e.source().begin.line) + ": " + std::string(e.description()));
  }
  HardwareProfile h;
  h.name = t["name"].value_or(file.stem().string());
  struct Field {
    const char* key;
    double* value;
    bool required;
  };
  const Field fields[] = {{"peak_flops", &h.peak_flops, true},        {"hbm_bytes_per_s", &h.hbm_bytes_per_s, true},
                          {"hbm_bytes", &h.hbm_bytes, true},          {"link_bytes_per_s", &h.link_bytes_per_s, true},
                          {"link_latency_s", &h.link_latency_s, false}, {"mfu", &h.mfu, false},
                          {"mbu", &h.mbu, false},                      {"step_overhead_s", &h.step_overhead_s, false},
                          {"kv_memory_fraction", &h.kv_memory_fraction, false},
                          {"reload_bytes_per_s", &h.reload_bytes_per_s, false}};
  for (const auto& f : fields) {
    auto node = t[f.key];
    if (!node) {
      if (f.required) throw Error(file.string() + ": missing '" + f.key + "' (a number)");
      continue;
    }
    auto v = node.value<double>();
    if (!v || *v < 0) throw Error(file.string() + ": '" + f.key + "' must be a non-negative number");
    *f.value = *v;
  }
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    bool known = key == "name";
    for (const auto& f : fields) known = known || key == f.key;
    if (!known) throw Error(file.string() + ": unknown key '" + key + "' in a hardware profile");
  }
  if (h.peak_flops <= 0 || h.hbm_bytes_per_s <= 0 || h.link_bytes_per_s <= 0 || h.reload_bytes_per_s <= 0 ||
      h.mfu <= 0 || h.mfu > 1 || h.mbu <= 0 || h.mbu > 1)
    throw Error(file.string() + ": peak_flops, hbm_bytes_per_s, link_bytes_per_s and reload_bytes_per_s must be above 0, "
                "mfu and mbu in (0, 1]");
  return h;
}

}  // namespace tandem::planner
