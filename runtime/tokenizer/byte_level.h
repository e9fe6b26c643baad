// GPT-2's byte-level alphabet: every byte 0..255 has a printable code point,
// so byte-level BPE vocabularies spell raw bytes as ordinary characters
// ("Ġ" is the space byte 0x20). Tandem converts such vocabularies back to raw
// bytes once at load time and tokenizes bytes directly.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::runtime {

// Code point standing for byte b.
uint32_t byte_to_code_point(uint8_t b);

// The raw bytes a byte-level token spells, or nullopt when one of its
// characters is not in the byte-level alphabet.
std::optional<std::string> byte_level_to_bytes(std::string_view token);

// The byte-level spelling of raw bytes.
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace tandem::runtime
