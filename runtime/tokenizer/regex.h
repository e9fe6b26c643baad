// A compiled PCRE2 pattern with UTF and Unicode properties (\p{L}, \s as
// Unicode white space), JIT-compiled when the platform allows. This is what the
// `Split` pre-tokenizer and `Replace` normalizer of tokenizer.json run.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace tandem::runtime {

class Regex {
 public:
  // Throws tandem::Error naming `where` when the pattern does not compile.
  // literal: match the pattern text as a plain string.
  Regex(std::string_view pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for every non-overlapping match in text, left
  // to right; text must be valid UTF-8. Thread-safe.
  void for_each_match(std::string_view text, const std::function<void(std::size_t, std::size_t)>& on_match) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::runtime
