#include "runtime/tokenizer/utf8.h"

namespace tandem::runtime {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const std::size_t n = utf8_char_len(c);
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (std::size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

namespace {

// Per the Unicode table of well-formed sequences: the allowed range of the
// second byte depends on the lead byte.
bool second_byte_ok(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

std::size_t expected_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // 0x80..0xC1, 0xF5..0xFF never start a sequence
}

// Number of bytes of s[i..] that form a valid (possibly incomplete) prefix of
// a sequence, and whether the sequence is complete.
std::size_t valid_run(std::string_view s, std::size_t i, bool& complete) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const std::size_t need = expected_len(lead);
  complete = false;
  if (need == 0) return 0;
  if (need == 1) {
    complete = true;
    return 1;
  }
  std::size_t k = 1;
  for (; k < need && i + k < s.size(); ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? !second_byte_ok(lead, b) : (b < 0x80 || b > 0xBF)) return k;
  }
  complete = k == need;
  return k;
}

}  // namespace

std::size_t valid_utf8_prefix_len(std::string_view s, std::size_t i) {
  bool complete = false;
  const std::size_t n = valid_run(s, i, complete);
  return complete ? n : 0;
}

bool is_valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = valid_utf8_prefix_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    bool complete = false;
    const std::size_t n = valid_run(bytes, i, complete);
    if (complete) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal invalid subpart
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

std::string_view trim_code_points(std::string_view s, bool left, bool right, bool (*strip)(uint32_t)) {
  std::size_t b = 0, e = s.size();
  while (left && b < e) {
    std::size_t i = b;
    if (!strip(next_code_point(s, i))) break;
    b = i;
  }
  while (right && e > b) {
    std::size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    std::size_t i = start;
    if (!strip(next_code_point(s, i))) break;
    e = start;
  }
  return s.substr(b, e - b);
}

bool ends_with_incomplete_utf8(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence is cut short.
  for (std::size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const std::size_t i = s.size() - back;
    const auto c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking
    bool complete = false;
    const std::size_t n = valid_run(s, i, complete);
    return !complete && n == back && expected_len(c) > back;
  }
  return false;
}

}  // namespace tandem::runtime
