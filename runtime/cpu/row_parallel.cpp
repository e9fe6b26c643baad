#include "runtime/cpu/row_parallel.h"

#include <algorithm>

namespace tandem::runtime::cpu {

std::vector<Matrix> split_columns(const Matrix& w, int first, int count, PanelStore& store) {
  std::vector<Matrix> parts;
  for (int c = first; c < first + count; ++c)
    parts.push_back(store.pack_columns(w, chunk_begin(w.cols, c), chunk_begin(w.cols, c + 1)));
  return parts;
}

TreeSum::TreeSum(std::vector<std::vector<float>>& buffers, int64_t rows, int64_t ld, int64_t c0, int64_t c1)
    : buffers_(buffers), rows_(rows), ld_(ld), c0_(c0), c1_(c1) {
  for (auto& b : buffers_)
    if (static_cast<int64_t>(b.size()) < rows * ld) b.resize(static_cast<std::size_t>(rows * ld));
  for (int i = static_cast<int>(buffers_.size()) - 1; i >= 0; --i) free_.push_back(i);
}

float* TreeSum::next() { return buffers_[static_cast<std::size_t>(free_.back())].data(); }

// The new partial is a leaf; the left of two halves takes their sum and the right's buffer is free again.
void TreeSum::push() {
  stack_.push_back(free_.back());
  free_.pop_back();
  levels_.push([&](int l, int r) {
    float* left = buffers_[static_cast<std::size_t>(stack_[static_cast<std::size_t>(l)])].data();
    const float* right = buffers_[static_cast<std::size_t>(stack_[static_cast<std::size_t>(r)])].data();
    for (int64_t row = 0; row < rows_; ++row)
      for (int64_t c = c0_; c < c1_; ++c) left[row * ld_ + c] += right[row * ld_ + c];
    free_.push_back(stack_.back());
    stack_.pop_back();
  });
}

const float* TreeSum::result() const { return buffers_[static_cast<std::size_t>(stack_.front())].data(); }

void sum_in_tree(const std::vector<const float*>& parts, int64_t n, float* out,
                 std::vector<std::vector<float>>& buffers) {
  TreeSum tree(buffers, 1, n, 0, n);
  for (const float* p : parts) {
    std::copy(p, p + n, tree.next());
    tree.push();
  }
  std::copy(tree.result(), tree.result() + n, out);
}

}  // namespace tandem::runtime::cpu
