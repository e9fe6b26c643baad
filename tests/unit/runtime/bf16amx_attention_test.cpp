// kBf16Amx's attention (kernels.h: KernelTable::attend): the FMA table and, where the CPU has AMX-BF16, the
// tile table held bit for bit to the rule written out here from kernels.h alone — scores by the tile rule over
// head_dim, the fixed softmax, the weights times the values by the tile rule over positions from 0 — for every
// KV element type, head sizes that are not whole tiles, decode (one row, the heads of a KV head) and prefill
// chunks (many rows, from any position), sliding windows; and the same query gives the same bits in any task.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/cpu/kernels.h"
#include "runtime/model/dtype.h"
#include "tests/unit/runtime/bf16amx_rule.h"

using namespace tandem::runtime;
using namespace tandem::runtime::cpu;
using tandem::runtime::cpu::test::bf16amx_tables;
using tandem::runtime::cpu::test::rule;

namespace {

// A sequence's keys and values, one KV head: positions 0 .. n-1 as rows of type kv, and their values as floats.
struct Kv {
  DType kv;
  int64_t hd, row_bytes;
  std::vector<uint8_t> k, v;
  std::vector<float> kf, vf;

  // bad >= 0: that position's key holds a NaN and its value an infinity (an FP8 row: a NaN scale, all NaN).
  Kv(DType kv_, int64_t n, int64_t hd_, std::mt19937& rng, int64_t bad = -1) : kv(kv_), hd(hd_) {
    row_bytes = kv == DType::kF8E4M3 ? hd + 4 : hd * static_cast<int64_t>(dtype_size(kv));
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (auto [bytes, floats] : {std::pair{&k, &kf}, std::pair{&v, &vf}}) {
      bytes->resize(static_cast<std::size_t>(n * row_bytes));
      floats->resize(static_cast<std::size_t>(n * hd));
      for (int64_t p = 0; p < n; ++p) {
        std::vector<float> x(static_cast<std::size_t>(hd));
        for (float& e : x) e = g(rng) * (p % 7 == 3 ? 8.0f : 1.0f);
        if (p == bad) x[3] = bytes == &k ? std::nanf("") : INFINITY;
        uint8_t* row = bytes->data() + p * row_bytes;
        float* out = floats->data() + p * hd;
        for (int64_t d = 0; d < hd; ++d) {
          const float e = x[static_cast<std::size_t>(d)];
          if (kv == DType::kF32) std::memcpy(row + 4 * d, &e, 4), out[d] = e;
          if (kv == DType::kBF16) {
            const uint16_t h = f32_to_bf16(e);
            std::memcpy(row + 2 * d, &h, 2), out[d] = bf16_to_f32(h);
          }
          if (kv == DType::kF16) {
            const uint16_t h = f32_to_f16(e);
            std::memcpy(row + 2 * d, &h, 2), out[d] = f16_to_f32(h);
          }
        }
        if (kv == DType::kF8E4M3) {
          quantize_fp8_row(x.data(), hd, row);
          widen_fp8_row_scalar(row, hd, out);
        }
      }
    }
  }
  const void* key(int64_t p) const { return k.data() + p * row_bytes; }
  const void* value(int64_t p) const { return v.data() + p * row_bytes; }
};

// The rule for one query at position pos (seeing [first, pos]): its output over head_dim.
std::vector<float> rule_attend(const float* q, const Kv& kv, int64_t pos, int64_t first, float scale) {
  const int64_t hd = kv.hd;
  const std::vector<float> qs(q, q + hd);
  std::vector<float> s(static_cast<std::size_t>(pos + 1 - first));
  for (int64_t p = first; p <= pos; ++p) {
    const std::vector<float> key(kv.kf.begin() + p * hd, kv.kf.begin() + (p + 1) * hd);
    s[static_cast<std::size_t>(p - first)] = rule(qs, key);
  }
  softmax_scalar(s.data(), static_cast<int64_t>(s.size()), scale);
  std::vector<float> w(static_cast<std::size_t>(pos + 1), 0.0f), out(static_cast<std::size_t>(hd));
  std::copy(s.begin(), s.end(), w.begin() + first);
  for (int64_t d = 0; d < hd; ++d) {
    std::vector<float> col(static_cast<std::size_t>(pos + 1));
    for (int64_t p = 0; p <= pos; ++p) col[static_cast<std::size_t>(p)] = kv.vf[static_cast<std::size_t>(p * hd + d)];
    out[static_cast<std::size_t>(d)] = rule(w, col);
  }
  return out;
}

// One task (rows from pos0, heads of one KV head, q laid out as the model's: [row][all heads][head_dim]) through
// `table`, every output checked against the rule.
void check_task(const KernelTable& table, const Kv& kv, int64_t rows, int64_t heads, int64_t pos0, int64_t window,
                std::mt19937& rng) {
  const int64_t hd = kv.hd, q_dim = (heads + 1) * hd;  // one more head in the row: not this task's
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(rows * q_dim));
  for (float& e : q) e = g(rng);
  std::vector<float> out(q.size(), -7.0f);
  const int64_t first = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0, base = first / 32 * 32;
  std::vector<const void*> keys, values;
  for (int64_t p = base; p < pos0 + rows; ++p) {
    keys.push_back(p < first ? nullptr : kv.key(p));
    values.push_back(p < first ? nullptr : kv.value(p));
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const AttendTask t{q.data(), out.data(), q_dim, hd, rows, heads, hd, pos0, window, base,
                     kv.kv, keys.data(), values.data(), scale};
  table.attend(t);
  std::vector<float> want(out.size(), -7.0f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < heads; ++j) {
      const int64_t pos = pos0 + i, f = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      const std::vector<float> o = rule_attend(q.data() + i * q_dim + j * hd, kv, pos, f, scale);
      std::copy(o.begin(), o.end(), want.begin() + i * q_dim + j * hd);
    }
  for (std::size_t i = 0; i < want.size(); ++i) {  // a NaN as a NaN (its payload is the hardware's), else the bits
    INFO("element " << i << ": " << out[i] << " vs " << want[i]);
    if (std::isnan(want[i]))
      REQUIRE(std::isnan(out[i]));
    else
      REQUIRE(std::memcmp(&out[i], &want[i], 4) == 0);
  }
}

}  // namespace

TEST_CASE("kBf16Amx attention: the tables give the rule's bits for every KV type, decode and prefill",
          "[kernels]") {
  std::mt19937 rng(7);
  for (const KernelTable* t : bf16amx_tables()) {
    REQUIRE(t->attend != nullptr);
    for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3}) {
      for (const int64_t hd : {128, 64, 80, 40}) {
        const Kv kv(dt, 200, hd, rng);
        INFO(t->name << " kv " << dtype_name(dt) << " head_dim " << hd);
        for (const int64_t heads : {1, 2, 8, 16, 20}) {  // decode: one row, the KV head's query heads
          INFO("decode, heads " << heads);
          check_task(*t, kv, 1, heads, 150, 0, rng);
        }
        for (auto [rows, pos0, heads] : {std::tuple{37, 0, 2}, {5, 60, 1}, {40, 131, 3}, {16, 32, 2}}) {
          INFO("prefill, rows " << rows << " from " << pos0 << ", heads " << heads);
          check_task(*t, kv, rows, heads, pos0, 0, rng);
          check_task(*t, kv, rows, heads, pos0, 50, rng);  // sliding window: rows before it not read (nullptr)
        }
      }
    }
  }
}

TEST_CASE("kBf16Amx attention: head_dim 256 and 96, contexts of thousands of positions, windows inside them",
          "[kernels]") {
  std::mt19937 rng(13);
  for (const KernelTable* t : bf16amx_tables()) {
    for (const int64_t hd : {256, 96}) {
      const Kv kv(DType::kBF16, 4700, hd, rng);
      INFO(t->name << " head_dim " << hd);
      check_task(*t, kv, 1, 4, 1290, 0, rng);     // decode deep in the context: its rows staged at once
      check_task(*t, kv, 1, 2, 1290, 700, rng);   // under a window that starts mid-block
      check_task(*t, kv, 1, 3, 4650, 0, rng);     // past 4,096 positions: staged window by window
      check_task(*t, kv, 1, 2, 4650, 4300, rng);  // a window of 4,300 positions: as long, from mid-block
      check_task(*t, kv, 53, 2, 1203, 0, rng);    // a prefill chunk from position 1,203
      check_task(*t, kv, 53, 1, 1203, 517, rng);  // and under a window: the first positions each row sees differ
    }
  }
}

TEST_CASE("kBf16Amx attention: a value that is not finite reaches only the queries that see it, as in decode",
          "[kernels]") {
  std::mt19937 rng(11);
  for (const KernelTable* t : bf16amx_tables()) {
    for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3}) {
      const Kv kv(dt, 100, 64, rng, 45);  // position 45: a NaN key, an infinite value
      INFO(t->name << " kv " << dtype_name(dt));
      check_task(*t, kv, 40, 2, 20, 0, rng);   // positions 20-44 finite (the rule), 45-59 NaN
      check_task(*t, kv, 40, 2, 20, 30, rng);  // and under a window
      check_task(*t, kv, 1, 4, 44, 0, rng);    // decode before it
      check_task(*t, kv, 1, 4, 60, 0, rng);    // and after it: NaN
    }
  }
}

TEST_CASE("kBf16Amx attention: other tables have none, so their attention stays kF32's", "[kernels]") {
  REQUIRE(scalar_kernels().attend == nullptr);
  if (avx512_kernels()) REQUIRE(avx512_kernels()->attend == nullptr);
  if (avx512_bf16_kernels()) REQUIRE(avx512_bf16_kernels()->attend == nullptr);
  if (avx512_vnni_kernels()) REQUIRE(avx512_vnni_kernels()->attend == nullptr);
}
