// The machine's own limits, measured: STREAM-style triad bandwidth, a
// read-only stream, and fused multiply-add peak. perf/engine_bench measures
// them in the same run as the engine; `tandem run` measures them at the start
// of a planned job for the CPU workers' hardware profile.
#pragma once

#include "planner/hardware.h"

namespace tandem::planner {

// a[i] = b[i] + s * c[i] over arrays far larger than the caches; GB/s
// counted as 3 x 4 bytes per element (two reads, one write).
double triad_gbps(int threads);

// A read-only stream: sums one array far larger than the caches; GB/s of
// bytes read. A matrix-vector product only reads, so this is its stricter
// ceiling (a triad also writes, and pays for it).
double read_gbps(int threads);

// Peak fp32 GFLOP/s of independent FMA chains (2 flops per lane).
// avx512: 16-lane zmm FMAs when the CPU has AVX-512F; else 8-lane AVX2.
double fma_peak_gflops(int threads, bool avx512);
bool cpu_has_avx512();

// Peak GFLOP/s of independent AVX512-BF16 dot-product chains (vdpbf16ps:
// 2 products a lane, 4 flops); 0 when the CPU has no AVX512-BF16.
double bf16_dot_peak_gflops(int threads);

// A profile of this CPU for `threads` compute threads per worker: FMA peak
// and triad bandwidth measured now (about a second), memory sized to hold
// `memory_bytes`, KV moving between ranks at the triad's speed.
HardwareProfile measure_cpu_profile(int threads, double memory_bytes);

}  // namespace tandem::planner
