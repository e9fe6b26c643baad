// tokenizer.json's `normalizer`: text rewriting applied to each stretch of
// input between added tokens, before pre-tokenization.
// Supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, Sequence.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace tandem::runtime {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// nullptr for a JSON null. Throws tandem::Error naming `where` and the
// unsupported type.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& where);

}  // namespace tandem::runtime
