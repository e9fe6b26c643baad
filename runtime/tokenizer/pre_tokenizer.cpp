#include "runtime/tokenizer/pre_tokenizer.h"

#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/tokenizer/regex.h"

namespace tandem::runtime {
namespace {

using Matches = std::vector<std::pair<std::size_t, std::size_t>>;

// GPT-2's pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

SplitBehavior parse_behavior(const std::string& b, const std::string& where) {
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  throw Error(where + ": Split behavior '" + b + "' is not supported");
}

void split_all(Pieces& pieces, const Regex& re, SplitBehavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.list.size() * 4);
  Matches m;
  for (const auto& p : pieces.list) {
    m.clear();
    re.for_each_match(p.text, [&](std::size_t b, std::size_t e) { m.emplace_back(b, e); });
    split_piece(p, m, behavior, invert, out);
  }
  pieces.list = std::move(out);
}

class Split : public PreTokenizer {
 public:
  Split(const nlohmann::json& spec, const std::string& where) {
    const auto& pat = spec.at("pattern");
    if (pat.contains("Regex")) regex_ = std::make_unique<Regex>(pat["Regex"].get<std::string>(), false, where);
    else if (pat.contains("String")) regex_ = std::make_unique<Regex>(pat["String"].get<std::string>(), true, where);
    else throw Error(where + ": Split needs a Regex or String pattern");
    behavior_ = parse_behavior(spec.value("behavior", "Isolated"), where);
    invert_ = spec.value("invert", false);
  }
  void apply(Pieces& pieces) const override { split_all(pieces, *regex_, behavior_, invert_); }

 private:
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(const nlohmann::json& spec, const std::string& where)
      : add_prefix_space_(spec.value("add_prefix_space", false)) {
    if (spec.value("use_regex", true)) regex_ = std::make_unique<Regex>(kGpt2Pattern, false, where);
  }
  void apply(Pieces& pieces) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces.list)
        if (!p.text.starts_with(' ')) p.text = pieces.keep(" " + std::string(p.text));
    }
    if (regex_) split_all(pieces, *regex_, SplitBehavior::kIsolated, false);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class Metaspace : public PreTokenizer {
 public:
  Metaspace(const nlohmann::json& spec, const std::string& where)
      : replacement_(spec.value("replacement", "\u2581")), split_(spec.value("split", true)) {
    std::string scheme = spec.value("prepend_scheme", "");
    if (scheme.empty()) scheme = spec.value("add_prefix_space", true) ? "always" : "never";
    if (scheme != "always" && scheme != "first" && scheme != "never")
      throw Error(where + ": Metaspace prepend_scheme '" + scheme + "' is not supported");
    scheme_ = scheme;
    splitter_ = std::make_unique<Regex>(replacement_, true, where);
  }
  void apply(Pieces& pieces) const override {
    for (auto& p : pieces.list) {
      std::string s;
      s.reserve(p.text.size() + replacement_.size());
      const bool prepend = scheme_ == "always" || (scheme_ == "first" && p.at_input_start);
      for (char c : p.text) {
        if (c == ' ') s += replacement_;
        else s += c;
      }
      if (prepend && !s.starts_with(replacement_)) s.insert(0, replacement_);
      p.text = pieces.keep(std::move(s));
    }
    if (split_) split_all(pieces, *splitter_, SplitBehavior::kMergedWithNext, false);
  }

 private:
  std::string replacement_;
  bool split_;
  std::string scheme_;
  std::unique_ptr<Regex> splitter_;
};

class Digits : public PreTokenizer {
 public:
  Digits(const nlohmann::json& spec, const std::string& where)
      : regex_(spec.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+", false, where) {}
  void apply(Pieces& pieces) const override { split_all(pieces, regex_, SplitBehavior::kIsolated, false); }

 private:
  Regex regex_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void apply(Pieces& pieces) const override {
    for (const auto& s : steps_) s->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec, const std::string& where,
                                                 PreTokenizerInfo& info) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.value("type", "");
  if (type == "Split") return std::make_unique<Split>(spec, where);
  if (type == "ByteLevel") {
    info.byte_level = true;
    return std::make_unique<ByteLevel>(spec, where);
  }
  if (type == "Metaspace") return std::make_unique<Metaspace>(spec, where);
  if (type == "Digits") return std::make_unique<Digits>(spec, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& s : spec.at("pretokenizers"))
      if (auto p = make_pre_tokenizer(s, where, info)) steps.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw Error(where + ": pre_tokenizer type '" + type +
              "' is not supported (supported: Split, ByteLevel, Metaspace, Digits, Sequence)");
}

}  // namespace tandem::runtime
