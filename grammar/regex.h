// Regular expressions (`structured_outputs.regex`, a JSON schema's `pattern`
// and `format`) as EBNF expressions for the grammar engine.
//
// The subset: literals and escapes (\n \r \t \f \v \0 \xHH \uHHHH, \ before
// any punctuation), `.` (any character but \n), classes [a-z] [^...] with
// \d \w \s \D \W \S (also outside classes), groups ( ) (?: ) (?<name> ),
// alternation |, quantifiers * + ? {n} {n,} {n,m} (a trailing ? or + for
// laziness or possessiveness is read and makes no difference to what
// matches). A pattern matches the whole text: ^ at the start and $ at the end
// are accepted and change nothing. Refused, with one line naming the
// construct: lookaround, backreferences, \b \B, anchors elsewhere, flags.
#pragma once

#include <string>
#include <string_view>

namespace tandem::grammar {

enum class RegexContext {
  kText,        // the text itself (structured_outputs.regex)
  kJsonString,  // inside a JSON string: no '"', '\' or control character is produced, so none needs escaping
};

// One EBNF expression (parenthesised) matching exactly what `pattern` does.
// Throws tandem::Error "regex 'PATTERN' at offset N: what; how to fix".
std::string regex_to_ebnf(std::string_view pattern, RegexContext context);

// EBNF spellings shared by the converters.
std::string ebnf_literal(std::string_view bytes);      // "..." with escapes
std::string ebnf_code_point(uint32_t cp);              // one character inside [...] or "..."

}  // namespace tandem::grammar
