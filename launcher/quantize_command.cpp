// `tandem quantize`: a bf16/f16/f32 checkpoint's linear layers written as
// 8-bit weights in a public layout (runtime/model/quantize.h), with the error
// each tensor took on.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "launcher/commands.h"
#include "runtime/model/quantize.h"

namespace tandem::launcher {

Action add_quantize_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("quantize", "Write a checkpoint's linear layers as FP8 (128x128 blocks) or INT8 (per channel)");
  auto o = std::make_shared<runtime::QuantizeOptions>();
  auto in = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto quiet = std::make_shared<bool>(false);
  cmd->add_option("--model", *in, "Checkpoint directory (bf16, f16 or f32 safetensors)")->required();
  cmd->add_option("--out", *out, "New directory for the quantized checkpoint")->required();
  cmd->add_option("--scheme", o->scheme,
                  "fp8-block (quant_method fp8, e4m3, 128x128 block scales) or int8-channel (compressed-tensors, "
                  "per-channel scales)")
      ->required()
      ->check(CLI::IsMember({"fp8-block", "int8-channel"}));
  cmd->add_flag("--quiet", *quiet, "Print only the summary, not a line per tensor");
  return [o, in, out, quiet]() {
    o->in_dir = *in;
    o->out_dir = *out;
    char line[512];
    const auto s = runtime::quantize_checkpoint(*o, [&](const runtime::TensorQuantError& e) {
      if (*quiet) return;
      std::snprintf(line, sizeof line, "%s [%lld, %lld]: max rel err %.3e, rms rel err %.3e\n", e.name.c_str(),
                    static_cast<long long>(e.rows), static_cast<long long>(e.cols), e.max_rel, e.rms_rel);
      std::cout << line << std::flush;
    });
    std::snprintf(line, sizeof line,
                  "wrote %s: %s, %lld tensors quantized, %lld kept; %.1f MiB -> %.1f MiB; worst max rel err %.3e (%s), "
                  "worst rms rel err %.3e (%s)\n",
                  out->c_str(), o->scheme.c_str(), static_cast<long long>(s.quantized), static_cast<long long>(s.kept),
                  static_cast<double>(s.bytes_in) / (1 << 20), static_cast<double>(s.bytes_out) / (1 << 20),
                  s.worst_max.max_rel, s.worst_max.name.c_str(), s.worst_rms.rms_rel, s.worst_rms.name.c_str());
    std::cout << line;
    return 0;
  };
}

}  // namespace tandem::launcher
