#include "runtime/tokenizer/normalizer.h"

#include <cstdlib>
#include <vector>

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include "common/error.h"
#include "runtime/tokenizer/regex.h"
#include "runtime/tokenizer/utf8.h"

namespace tandem::runtime {
namespace {

bool is_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(utf8proc_option_t options) : options_(options) {}
  void normalize(std::string& text) const override {
    if (is_ascii(text)) return;  // every normal form leaves ASCII alone
    utf8proc_uint8_t* out = nullptr;
    auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                          static_cast<utf8proc_ssize_t>(text.size()), &out, options_);
    if (n >= 0) text.assign(reinterpret_cast<char*>(out), static_cast<std::size_t>(n));
    std::free(out);
  }

 private:
  utf8proc_option_t options_;
};

class Lowercase : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) append_utf8(out, utf8proc_tolower(next_code_point(text, i)));
    text = std::move(out);
  }
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : prefix_(std::move(p)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Replace : public Normalizer {
 public:
  Replace(const nlohmann::json& pattern, std::string content, const std::string& where)
      : content_(std::move(content)) {
    if (pattern.contains("String")) {
      literal_ = pattern["String"].get<std::string>();
    } else if (pattern.contains("Regex")) {
      regex_ = std::make_unique<Regex>(pattern["Regex"].get<std::string>(), false, where);
    } else {
      throw Error(where + ": Replace needs a String or Regex pattern");
    }
  }
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    std::size_t prev = 0;
    auto emit = [&](std::size_t b, std::size_t e) {
      out.append(text, prev, b - prev);
      out += content_;
      prev = e;
    };
    if (regex_) {
      regex_->for_each_match(text, emit);
    } else if (!literal_.empty()) {
      for (std::size_t at = text.find(literal_); at != std::string::npos; at = text.find(literal_, prev))
        emit(at, at + literal_.size());
    }
    out.append(text, prev, std::string::npos);
    text = std::move(out);
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    auto is_space = [](uint32_t cp) {
      return utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_ZS || (cp >= 9 && cp <= 13) ||
             cp == 0x85;
    };
    text = std::string(trim_code_points(text, left_, right_, is_space));
  }

 private:
  bool left_, right_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& s : steps_) s->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.value("type", "");
  if (type == "NFC") return std::make_unique<UnicodeForm>(utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (type == "NFD") return std::make_unique<UnicodeForm>(utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  if (type == "NFKC")
    return std::make_unique<UnicodeForm>(utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  if (type == "NFKD")
    return std::make_unique<UnicodeForm>(utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Prepend") return std::make_unique<Prepend>(spec.at("prepend").get<std::string>());
  if (type == "Replace")
    return std::make_unique<Replace>(spec.at("pattern"), spec.at("content").get<std::string>(), where);
  if (type == "Strip") return std::make_unique<Strip>(spec.value("strip_left", true), spec.value("strip_right", true));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& s : spec.at("normalizers"))
      if (auto n = make_normalizer(s, where)) steps.push_back(std::move(n));
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw Error(where + ": normalizer type '" + type +
              "' is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, Sequence)");
}

}  // namespace tandem::runtime
