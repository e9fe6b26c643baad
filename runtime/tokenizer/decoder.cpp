#include "runtime/tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/tokenizer/byte_level.h"
#include "runtime/tokenizer/utf8.h"

namespace tandem::runtime {
namespace {

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      // A token outside the byte alphabet (an added token like "<|im_end|>"
      // usually is inside it) passes through as its own UTF-8.
      if (auto b = byte_level_to_bytes(t)) bytes += *b;
      else bytes += t;
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (from_.empty()) return;
    for (auto& t : tokens) {
      std::string out;
      std::size_t prev = 0;
      for (std::size_t at = t.find(from_); at != std::string::npos; at = t.find(from_, prev)) {
        out.append(t, prev, at - prev);
        out += to_;
        prev = at + from_.size();
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string from_, to_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (is_valid_utf8(pending)) out.push_back(pending);
      else
        for (std::size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (auto& t : tokens) {
      if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
          std::isxdigit(static_cast<unsigned char>(t[4]))) {
        pending += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, std::size_t start, std::size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      for (std::size_t k = 0; k < start_ && t.starts_with(content_); ++k) t.erase(0, content_.size());
      for (std::size_t k = 0; k < stop_ && t.ends_with(content_); ++k) t.resize(t.size() - content_.size());
    }
  }

 private:
  std::string content_;
  std::size_t start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    ReplaceDecoder(replacement_, " ").decode_chain(tokens);
    if (strip_first_ && !tokens.empty() && tokens[0].starts_with(' ')) tokens[0].erase(0, 1);
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& s : steps_) s->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.value("type", "");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    const auto& pat = spec.at("pattern");
    if (!pat.contains("String")) throw Error(where + ": Replace decoder supports only String patterns");
    return std::make_unique<ReplaceDecoder>(pat["String"].get<std::string>(), spec.at("content").get<std::string>());
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip")
    return std::make_unique<StripDecoder>(spec.at("content").get<std::string>(), spec.value("start", 0u),
                                          spec.value("stop", 0u));
  if (type == "Metaspace") {
    std::string scheme = spec.value("prepend_scheme", "");
    if (scheme.empty()) scheme = spec.value("add_prefix_space", true) ? "always" : "never";
    return std::make_unique<MetaspaceDecoder>(spec.value("replacement", "\u2581"), scheme != "never");
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& s : spec.at("decoders"))
      if (auto d = make_decoder(s, where)) steps.push_back(std::move(d));
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  throw Error(where + ": decoder type '" + type +
              "' is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)");
}

}  // namespace tandem::runtime
