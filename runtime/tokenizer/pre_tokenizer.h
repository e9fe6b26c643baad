// tokenizer.json's `pre_tokenizer`: cuts normalized text into the words that
// BPE then tokenizes one by one. Supported: Split (PCRE2), ByteLevel,
// Metaspace, Digits, Sequence. Pieces stay raw UTF-8: ByteLevel's mapping of
// bytes to printable characters is done once on the vocabulary instead
// (byte_level.h), so ByteLevel here only adds its prefix space or GPT-2 split.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "runtime/tokenizer/pieces.h"

namespace tandem::runtime {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces pieces.list with its pre-tokenized form. Thread-safe.
  virtual void apply(Pieces& pieces) const = 0;
};

struct PreTokenizerInfo {
  bool byte_level = false;  // a ByteLevel step is present: the vocabulary spells bytes
};

// nullptr for a JSON null. Throws tandem::Error naming `where` and the
// unsupported type or option.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec, const std::string& where,
                                                 PreTokenizerInfo& info);

}  // namespace tandem::runtime
