#include "runtime/model/rope.h"

#include <cmath>

namespace tandem::runtime {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<std::size_t>(half));
  const auto& rs = c.rope_scaling;
  for (int64_t i = 0; i < half; ++i) {
    // As Hugging Face computes it, in float32.
    float f = static_cast<float>(1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim)));
    if (rs.type == RopeScaling::Type::kLinear) {
      f = static_cast<float>(f / rs.factor);
    } else if (rs.type == RopeScaling::Type::kLlama3) {
      const double old_len = static_cast<double>(rs.original_max_position_embeddings);
      const double low_wavelen = old_len / rs.low_freq_factor;
      const double high_wavelen = old_len / rs.high_freq_factor;
      const double wavelen = 2.0 * M_PI / f;
      double g = f;
      if (wavelen > low_wavelen) g = f / rs.factor;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth = (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        g = (1.0 - smooth) * f / rs.factor + smooth * f;
      }
      f = static_cast<float>(g);
    }
    inv[static_cast<std::size_t>(i)] = f;
  }
  return inv;
}

}  // namespace tandem::runtime
