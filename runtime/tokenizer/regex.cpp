#include "runtime/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/error.h"

namespace tandem::runtime {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
};

namespace {

// One JIT stack per thread, large enough for long whitespace runs.
pcre2_match_context* thread_match_context() {
  struct Ctx {
    pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
    Ctx() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
    ~Ctx() {
      pcre2_match_context_free(ctx);
      pcre2_jit_stack_free(stack);
    }
  };
  thread_local Ctx c;
  return c.ctx;
}

}  // namespace

Regex::Regex(std::string_view pattern, bool literal, const std::string& where) : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err, &offset,
                              nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(where + ": regex does not compile at offset " + std::to_string(offset) + ": " +
                reinterpret_cast<char*>(msg));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(impl_->code); }

void Regex::for_each_match(std::string_view text,
                           const std::function<void(std::size_t, std::size_t)>& on_match) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  pcre2_match_context* ctx = thread_match_context();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;
  while (pos <= text.size()) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), pos, 0, md, ctx)
                        : pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, ctx);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit: treat the rest as unmatched
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    std::size_t b = ov[0], e = ov[1];
    if (e == b) {
      // Empty match: tokenizers' patterns never produce one usefully; step one character.
      if (b >= text.size()) break;
      pos = b + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    on_match(b, e);
    pos = e;
  }
  pcre2_match_data_free(md);
}

}  // namespace tandem::runtime
