// The machine's own limits, measured in the same run as a benchmark:
// STREAM-style triad bandwidth and fused multiply-add peak.
#pragma once

namespace tandem::perf {

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

}  // namespace tandem::perf
