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

  int64_t run = 0;  // > 0: rows in runs of this many, a row of NaN bytes after each (a pool of such blocks)

  // bad >= 0: that position's key holds a NaN and its value an infinity (an FP8 row: a NaN scale, all NaN).
  Kv(DType kv_, int64_t n, int64_t hd_, std::mt19937& rng, int64_t bad = -1, int64_t run_ = 0)
      : kv(kv_), hd(hd_), run(run_) {
    row_bytes = kv == DType::kF8E4M3 ? hd + 4 : hd * static_cast<int64_t>(dtype_size(kv));
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (auto [bytes, floats] : {std::pair{&k, &kf}, std::pair{&v, &vf}}) {
      bytes->assign(static_cast<std::size_t>(slot(n) * row_bytes), 0xFF);
      floats->resize(static_cast<std::size_t>(n * hd));
      for (int64_t p = 0; p < n; ++p) {
        std::vector<float> x(static_cast<std::size_t>(hd));
        for (float& e : x) e = g(rng) * (p % 7 == 3 ? 8.0f : 1.0f);
        if (p == bad) x[3] = bytes == &k ? std::nanf("") : INFINITY;
        uint8_t* row = bytes->data() + slot(p) * row_bytes;
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
  int64_t slot(int64_t p) const { return run > 0 ? p + p / run : p; }
  const void* key(int64_t p) const { return k.data() + slot(p) * row_bytes; }
  const void* value(int64_t p) const { return v.data() + slot(p) * row_bytes; }
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
    for (int64_t p = 0; p <= pos; ++p) {  // 0 x inf is not taken: a value not finite counts where it is seen
      const float v = kv.vf[static_cast<std::size_t>(p * hd + d)];
      col[static_cast<std::size_t>(p)] = p < first && !std::isfinite(v) ? 0.0f : v;
    }
    out[static_cast<std::size_t>(d)] = rule(w, col);
  }
  return out;
}

// One task's outputs (rows from pos0, heads of one KV head, q laid out as the model's: [row][all heads][head_dim],
// one more head in the row than the task's) through `table`; elements not the task's stay -7.
std::vector<float> attend(const KernelTable& table, const Kv& kv, const std::vector<float>& q, int64_t rows,
                          int64_t heads, int64_t pos0, int64_t window) {
  const int64_t hd = kv.hd, q_dim = (heads + 1) * hd;
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
  return out;
}

std::vector<float> random_queries(int64_t rows, int64_t heads, int64_t hd, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(rows * (heads + 1) * hd));
  for (float& e : q) e = g(rng);
  return q;
}

// One task through `table`, every output checked against the rule.
void check_task(const KernelTable& table, const Kv& kv, int64_t rows, int64_t heads, int64_t pos0, int64_t window,
                std::mt19937& rng) {
  const int64_t hd = kv.hd, q_dim = (heads + 1) * hd;
  const std::vector<float> q = random_queries(rows, heads, hd, rng);
  const std::vector<float> out = attend(table, kv, q, rows, heads, pos0, window);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
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

TEST_CASE("kBf16Amx attention: rows that are not runs of 16 (a pool of smaller blocks) give the same bits",
          "[kernels]") {
  std::mt19937 rng(17);
  for (const KernelTable* t : bf16amx_tables()) {
    for (const int64_t run : {8, 24}) {  // a bf16 pool is read in place where 16 rows run on, else staged
      const Kv kv(DType::kBF16, 700, 64, rng, -1, run);
      INFO(t->name << " runs of " << run);
      check_task(*t, kv, 1, 4, 650, 0, rng);
      check_task(*t, kv, 1, 2, 650, 300, rng);
      check_task(*t, kv, 45, 2, 600, 0, rng);
      check_task(*t, kv, 45, 1, 600, 130, rng);
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

TEST_CASE("kBf16Amx attention: a value that is not finite, in contexts of several windows and under windows "
          "that pass it", "[kernels]") {
  std::mt19937 rng(19);
  for (const KernelTable* t : bf16amx_tables()) {
    for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3}) {
      const Kv kv(dt, 1400, 80, rng, 600);  // position 600: a NaN key, an infinite value
      INFO(t->name << " kv " << dtype_name(dt));
      for (auto [rows, heads, pos0, window] : {std::tuple{1, 2, 1390, 0},  // decode that sees it: NaN
                                               {1, 2, 1390, 700},          // a window past it: the rule's values
                                               {40, 2, 590, 30},   // a tile whose first queries see it, last do not
                                               {37, 1, 1300, 0}}) {        // a chunk whose every query sees it
        INFO(rows << " rows from " << pos0 << ", window " << window);
        check_task(*t, kv, rows, heads, pos0, window, rng);
      }
    }
    const Kv deep(DType::kBF16, 4700, 64, rng, 100);
    INFO(t->name << " 4,700 positions, position 100 not finite");
    check_task(*t, deep, 1, 3, 4650, 4400, rng);  // windows of 512 staged in turn, past it: the rule's values
    check_task(*t, deep, 1, 3, 4650, 4097, rng);  // 4,097 positions: one past the rows staged at once
    check_task(*t, deep, 1, 3, 4650, 4096, rng);  // 4,096: staged at once
  }
}

TEST_CASE("kBf16Amx attention: a bf16 pool as the engine stores it gives float32 KV's bits, subnormals and "
          "overflow included (kv.dtype = auto under bf16-amx)", "[kernels]") {
  // vcvtneps2bf16's own results (measured on a Sapphire Rapids): f32_to_bf16_flushed is that rounding
  const std::pair<uint32_t, uint16_t> cases[] = {
      {0x007FFFFF, 0x0000}, {0x807F8000, 0x8000}, {0x00000001, 0x0000}, {0x80000001, 0x8000}, {0x007F8000, 0x0000},
      {0x7F7FFFFF, 0x7F80}, {0xFF7FFFFF, 0xFF80}, {0x7FC00001, 0x7FC0}, {0x7F800001, 0x7FC0}, {0x00800000, 0x0080},
      {0x3F808000, 0x3F80}, {0x3F818000, 0x3F82}, {0x00000000, 0x0000}, {0x80000000, 0x8000}, {0xFFFFFFFF, 0xFFFF}};
  for (auto [in, want] : cases) {
    float f;
    std::memcpy(&f, &in, 4);
    INFO(std::hex << in);
    CHECK(f32_to_bf16_flushed(f) == want);
  }
  std::mt19937 rng(23);
  for (const KernelTable* t : bf16amx_tables()) {
    Kv f32(DType::kF32, 200, 64, rng);
    const uint32_t edges[] = {0x007FFFFF, 0x807F8000, 0x00400000, 0x80000001, 0x007F8000, 0x00800000, 0x7F7FFFFF};
    // positions 3, 32, ..., 177: one element of the key and of the value, the rest of the value row zeros (a
    // window of 1 position then gives that value itself: bf16(2^-126 - ulp) as 2^-126 would show)
    for (std::size_t i = 0; i < std::size(edges); ++i) {
      const int64_t p = static_cast<int64_t>(3 + 29 * i);
      std::memset(f32.v.data() + p * f32.row_bytes, 0, static_cast<std::size_t>(f32.row_bytes));
      for (auto* bytes : {&f32.k, &f32.v}) std::memcpy(bytes->data() + p * f32.row_bytes + 4 * (5 + i), &edges[i], 4);
    }
    Kv b16 = f32;  // the same floats as the engine's store_kv would hold them in a bf16 pool
    b16.kv = DType::kBF16, b16.row_bytes = 2 * b16.hd;
    for (auto [from, to] : {std::pair{&f32.k, &b16.k}, std::pair{&f32.v, &b16.v}}) {
      to->resize(from->size() / 2);
      for (std::size_t e = 0; e < from->size() / 4; ++e) {
        float x;
        std::memcpy(&x, from->data() + 4 * e, 4);
        const uint16_t h = f32_to_bf16_flushed(x);
        std::memcpy(to->data() + 2 * e, &h, 2);
      }
    }
    std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> tasks = {{1, 4, 190, 0}, {1, 2, 120, 50},
                                                                           {60, 2, 100, 0}};
    for (int64_t i = 0; i < 7; ++i) tasks.emplace_back(1, 2, 3 + 29 * i, 1);  // each planted row alone
    for (auto [rows, heads, pos0, window] : tasks) {
      INFO(t->name << ": " << rows << " rows from " << pos0 << ", window " << window);
      const std::vector<float> q = random_queries(rows, heads, 64, rng);
      const std::vector<float> a = attend(*t, f32, q, rows, heads, pos0, window);
      const std::vector<float> b = attend(*t, b16, q, rows, heads, pos0, window);
      REQUIRE(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    }
  }
}

TEST_CASE("kBf16Amx attention: other tables have none, so their attention stays kF32's", "[kernels]") {
  REQUIRE(scalar_kernels().attend == nullptr);
  if (avx512_kernels()) REQUIRE(avx512_kernels()->attend == nullptr);
  if (avx512_bf16_kernels()) REQUIRE(avx512_bf16_kernels()->attend == nullptr);
  if (avx512_vnni_kernels()) REQUIRE(avx512_vnni_kernels()->attend == nullptr);
}
