// Free text that never holds a given marker, as an EBNF expression: what a
// model may write before its tool calls (they begin with the marker), or
// inside a <think> block (which ends at one). Built from the marker's
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

}  // namespace tandem::grammar
