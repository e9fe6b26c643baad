#include "runtime/tokenizer/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace tandem::runtime {
namespace {

void put_string(const std::string& s, std::string& out) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;  // UTF-8 as it is (ensure_ascii=False)
        }
    }
  }
  out += '"';
}

// Python's float.__repr__: the shortest digits that read back to the same
// double; positional notation for decimal exponents -4..15 (always with a
// fractional part: 1.0), else d.ddde+XX with at least two exponent digits.
void put_float(double v, std::string& out) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v < 0 ? "-Infinity" : "Infinity";
    return;
  }
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // [-]d[.ddd]e[+-]XX
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const auto e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  out += sign;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits + std::string(static_cast<std::size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(exp + 1)) + "." + digits.substr(static_cast<std::size_t>(exp + 1));
    }
    return;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  out += ebuf;
}

void put(const nlohmann::ordered_json& v, int indent, int level, std::string& out) {
  using T = nlohmann::ordered_json::value_t;
  const auto newline = [&](int at) {
    out += '\n';
    out.append(static_cast<std::size_t>(indent * at), ' ');
  };
  switch (v.type()) {
    case T::null: out += "null"; return;
    case T::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case T::number_integer: out += std::to_string(v.get<int64_t>()); return;
    case T::number_unsigned: out += std::to_string(v.get<uint64_t>()); return;
    case T::number_float: put_float(v.get<double>(), out); return;
    case T::string: put_string(v.get_ref<const std::string&>(), out); return;
    case T::array:
    case T::object: {
      const bool obj = v.is_object();
      if (v.empty()) {
        out += obj ? "{}" : "[]";
        return;
      }
      out += obj ? '{' : '[';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        if (indent >= 0) newline(level + 1);
        if (obj) {
          put_string(it.key(), out);
          out += ": ";
        }
        put(*it, indent, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out += obj ? '}' : ']';
      return;
    }
    default: out += "null"; return;  // binary and discarded values never come from parsed JSON
  }
}

}  // namespace

std::string py_json_dumps(const nlohmann::ordered_json& value, int indent) {
  std::string out;
  put(value, indent, 0, out);
  return out;
}

}  // namespace tandem::runtime
