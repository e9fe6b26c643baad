// The row-parallel products (o_proj and down_proj: y = x W^T where tensor
// parallelism splits K, the reduced dimension) in the one form that every
// TP width computes bit for bit alike.
//
// K is cut into kReduceChunks = 8 fixed column chunks (chunk c is columns
// [c K / 8, (c + 1) K / 8)). Each chunk's dot products are the kernels' own
// (kernels.h); the 8 partial results are then added in one fixed binary
// tree, ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)). A group of width
// tp (1, 2, 4 or 8) gives rank r the chunks [r 8/tp, (r + 1) 8/tp): it adds
// its own chunks as the subtree they form, and the group adds the ranks'
// subtrees in the same tree. Floating-point addition is commutative, so only
// the tree's shape matters, and it is the same at every width.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/weights.h"

namespace tandem::runtime::cpu {

constexpr int kReduceChunks = 8;

// The first column of chunk c (c = kReduceChunks: k).
constexpr int64_t chunk_begin(int64_t k, int c) { return k * c / kReduceChunks; }

// Chunks [first, first + count) of w's columns, each a matrix of its own (in
// `store`).
std::vector<Matrix> split_columns(const Matrix& w, int first, int count, PanelStore& store);

// The fixed tree's shape, as partials arrive left to right on a stack: push() a leaf (at depth() - 1 after it),
// and while the two on top are of one level they are one subtree's halves: add(left, right), stack positions
// depth() - 2 and depth() - 1, must put their sum in left (the right one is then dropped). Every adder of the
// tree (kernels, TreeSum) keeps its partials itself and this their levels.
class TreeLevels {
 public:
  template <class Add>
  void push(Add&& add) {
    level_[depth_++] = 0;
    while (depth_ >= 2 && level_[depth_ - 1] == level_[depth_ - 2]) {
      add(depth_ - 2, depth_ - 1);
      --depth_;
      ++level_[depth_ - 1];
    }
  }
  int depth() const { return depth_; }

 private:
  int level_[32];  // a stack of 2^31 leaves at most
  int depth_ = 0;
};

// Adds partial results in the fixed tree as they come, left to right, with
// at most log2(count) + 1 buffers alive (buffers.size() of them, at least
// that): push() the next partial (written into next()), and after the last
// one result() holds the sum. count must be a power of two. A partial is
// `rows` rows of `ld` floats of which columns [c0, c1) count.
class TreeSum {
 public:
  TreeSum(std::vector<std::vector<float>>& buffers, int64_t rows, int64_t ld, int64_t c0, int64_t c1);
  float* next();  // where the next partial is to be written
  void push();    // the partial written into next() is complete
  const float* result() const;

 private:
  std::vector<std::vector<float>>& buffers_;
  int64_t rows_, ld_, c0_, c1_;
  std::vector<int> stack_;  // buffer indexes; levels_ alongside
  TreeLevels levels_;
  std::vector<int> free_;
};

// out = the fixed tree over parts (each n floats, their count a power of
// two), in order: a group's sum of its ranks' partial sums.
void sum_in_tree(const std::vector<const float*>& parts, int64_t n, float* out,
                 std::vector<std::vector<float>>& buffers);

}  // namespace tandem::runtime::cpu
