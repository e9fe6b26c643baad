// Free text that never holds a given marker, as an EBNF expression: what a
// model may write before its tool calls (they begin with the marker), or
// inside a <think> block (which ends at one); and text that does not begin
// with a given prefix. Built from the marker's
// matching automaton, so it is exact: every text without the marker is
// accepted, none with it, in any split into tokens.
#pragma once

#include <string>
#include <string_view>

namespace tandem::grammar {

// One parenthesised EBNF expression matching every UTF-8 text (the empty
// one included) in which `marker` does not occur. The marker must be ASCII,
// at least two bytes long, and its first byte must not occur again in it
// ("<tool_call>", "</think>", "[TOOL_CALLS]"): then a failed partial match
// never hides the start of another. Throws tandem::Error otherwise.
std::string ebnf_text_without(std::string_view marker);

// One parenthesised EBNF expression matching every UTF-8 text (the empty one
// included) that does not begin with `prefix` (ASCII, not empty): what a
// model may answer instead of a call whose format starts the answer
// (Llama 3.1's {"name": ...}).
std::string ebnf_text_not_starting_with(std::string_view prefix);

}  // namespace tandem::grammar
