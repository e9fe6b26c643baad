// tokenizer.json's `decoder`: turns token strings back into text. Runs the
// same chain of steps Hugging Face runs, each on the list of token strings:
// ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tandem::runtime {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// nullptr for a JSON null (tokens are then joined with spaces, as Hugging Face
// does). Throws tandem::Error naming `where` and the unsupported type.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec, const std::string& where);

}  // namespace tandem::runtime
