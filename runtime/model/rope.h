// Rotary embedding frequencies of a model, exactly as Hugging Face computes
// them (float32, with linear or llama3 scaling): one table for every backend.
#pragma once

#include <vector>

#include "runtime/model/model_config.h"

namespace tandem::runtime {

// [head_dim / 2]: the angle of pair i at position p is p * inv_freq[i] (in float32).
std::vector<float> rope_inv_freq(const ModelConfig& config);

}  // namespace tandem::runtime
