#include "slurm/hostlist.h"

#include <cctype>

#include "common/error.h"

namespace tandem::slurm {
namespace {

[[noreturn]] void bad(std::string_view expr, const std::string& why) {
  throw Error("hostlist '" + std::string(expr) + "': " + why);
}

// The values of one bracket's inside, "01-03,7", each zero-padded to its token's width.
std::vector<std::string> bracket_values(std::string_view inside, std::string_view expr) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= inside.size()) {
    const std::size_t comma = std::min(inside.find(',', pos), inside.size());
    const std::string_view item = inside.substr(pos, comma - pos);
    const std::size_t dash = item.find('-');
    const std::string_view lo = item.substr(0, dash);
    const std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    auto digits = [](std::string_view s) {
      if (s.empty()) return false;
      for (char c : s)
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
      return true;
    };
    if (!digits(lo) || !digits(hi)) bad(expr, "'" + std::string(item) + "' is not a number or a range like 01-04");
    const unsigned long a = std::stoul(std::string(lo)), b = std::stoul(std::string(hi));
    if (b < a) bad(expr, "range '" + std::string(item) + "' runs backwards");
    if (b - a > 100000) bad(expr, "range '" + std::string(item) + "' is too large");
    const std::size_t width = lo.size();
    for (unsigned long v = a; v <= b; ++v) {
      std::string s = std::to_string(v);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      out.push_back(std::move(s));
    }
    pos = comma + 1;
  }
  return out;
}

// One host pattern without top-level commas: text and bracket groups.
void expand_one(std::string_view pattern, std::string_view expr, std::vector<std::string>& out) {
  std::vector<std::string> acc{""};
  std::size_t pos = 0;
  while (pos < pattern.size()) {
    const std::size_t open = pattern.find('[', pos);
    const std::string_view text = pattern.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos);
    for (auto& a : acc) a += text;
    if (open == std::string_view::npos) break;
    const std::size_t close = pattern.find(']', open);
    if (close == std::string_view::npos) bad(expr, "'[' without ']'");
    const auto values = bracket_values(pattern.substr(open + 1, close - open - 1), expr);
    std::vector<std::string> next;
    next.reserve(acc.size() * values.size());
    for (const auto& a : acc)
      for (const auto& v : values) next.push_back(a + v);
    acc = std::move(next);
    pos = close + 1;
  }
  for (auto& a : acc) out.push_back(std::move(a));
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view expr) {
  std::vector<std::string> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= expr.size(); ++i) {
    const char c = i < expr.size() ? expr[i] : ',';
    if (c == '[') ++depth;
    else if (c == ']') {
      if (--depth < 0) bad(expr, "']' without '['");
    } else if (c == ',' && depth == 0) {
      if (i > start) expand_one(expr.substr(start, i - start), expr, out);
      start = i + 1;
    }
  }
  if (depth != 0) bad(expr, "'[' without ']'");
  return out;
}

}  // namespace tandem::slurm
