#include "runtime/tokenizer/byte_level.h"

#include <unordered_map>

#include "runtime/tokenizer/utf8.h"

namespace tandem::runtime {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::unordered_map<uint32_t, uint8_t> to_byte;
  Tables() {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? b : 256 + extra++;
      to_byte[to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_code_point(uint8_t b) { return tables().to_cp[b]; }

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  const auto& t = tables();
  for (std::size_t i = 0; i < token.size();) {
    const uint32_t cp = next_code_point(token, i);
    auto it = t.to_byte.find(cp);
    if (it == t.to_byte.end()) return std::nullopt;
    out += static_cast<char>(it->second);
  }
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, tables().to_cp[b]);
  return out;
}

}  // namespace tandem::runtime
