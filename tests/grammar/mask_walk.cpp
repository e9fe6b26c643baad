// Random walks through a grammar with a real tokenizer, for the xgrammar
// comparison (xgrammar_masks_test.cjs): at each step, our token mask and the
// token taken, as JSON lines the Node side replays through xgrammar.
//
// Usage: mask_walk TOKENIZER_DIR GRAMMAR WALKS STEPS SEED | --print-ebnf SCHEMA.json; GRAMMAR is EBNF,
// or a JSON schema when its name ends in .json.
// Out, one line per step: {"walk":w,"step":s,"mask":"<base64 of uint32 LE words,
// bit id%32 of word id/32>","token":id}; then {"vocab_size":n,"ends":[...]} first.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "runtime/tokenizer/tokenizer.h"

namespace {

std::string base64(const std::vector<uint32_t>& words) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  for (const uint32_t w : words) {
    for (int b = 0; b < 4; ++b) bytes += static_cast<char>((w >> (8 * b)) & 0xFF);
  }
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? k[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? k[v & 63] : '=';
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  if (argc == 3 && std::string(argv[1]) == "--print-ebnf") {  // a JSON schema as our EBNF
    std::ifstream in(argv[2]);
    std::stringstream text;
    text << in.rdbuf();
    try {
      std::cout << grammar::json_schema_to_ebnf(nlohmann::ordered_json::parse(text.str()));
    } catch (const std::exception& e) {
      std::cerr << "mask_walk: " << e.what() << "\n";
      return 1;
    }
    return 0;
  }
  if (argc != 6) {
    std::cerr << "usage: mask_walk TOKENIZER_DIR GRAMMAR.ebnf WALKS STEPS SEED\n";
    return 2;
  }
  try {
    const auto tok = runtime::Tokenizer::load(argv[1]);
    std::ifstream in(argv[2]);
    std::stringstream text;
    text << in.rdbuf();
    std::vector<std::string> bytes(static_cast<std::size_t>(tok->vocab_size()));
    for (int32_t id = 0; id < tok->vocab_size(); ++id) bytes[static_cast<std::size_t>(id)] = tok->token_bytes(id);
    std::vector<int32_t> ends;
    if (const auto eos = tok->eos_id()) ends.push_back(*eos);
    auto vocab = std::make_shared<grammar::Vocabulary>(std::move(bytes), ends);
    const std::string path = argv[2];
    const std::string ebnf = path.ends_with(".json")
                                 ? grammar::json_schema_to_ebnf(nlohmann::ordered_json::parse(text.str()))
                                 : text.str();
    auto compiled = std::make_shared<grammar::CompiledGrammar>(grammar::Grammar::from_ebnf(ebnf), vocab);
    std::cout << "{\"vocab_size\":" << vocab->size() << ",\"ends\":[" << (ends.empty() ? "" : std::to_string(ends[0]))
              << "]}\n";
    std::mt19937 rng(static_cast<uint32_t>(std::stoul(argv[5])));
    const int walks = std::stoi(argv[3]), steps = std::stoi(argv[4]);
    std::vector<uint64_t> mask(vocab->mask_words());
    for (int w = 0; w < walks; ++w) {
      grammar::TokenMatcher m(compiled);
      for (int s = 0; s < steps && !m.ended(); ++s) {
        m.fill_mask(mask);
        std::vector<int32_t> allowed;
        std::vector<uint32_t> words((static_cast<std::size_t>(vocab->size()) + 31) / 32, 0);
        for (int32_t id = 0; id < vocab->size(); ++id) {
          if ((mask[static_cast<std::size_t>(id) / 64] >> (id % 64)) & 1) {
            allowed.push_back(id);
            words[static_cast<std::size_t>(id) / 32] |= uint32_t{1} << (id % 32);
          }
        }
        if (allowed.empty()) {
          std::cerr << "mask_walk: walk " << w << " step " << s << ": no token allowed\n";
          return 1;
        }
        int32_t pick = allowed[rng() % allowed.size()];
        if (m.can_end() && !ends.empty() && s >= 8 && rng() % 3 == 0) pick = ends[0];  // walks of some length
        std::cout << "{\"walk\":" << w << ",\"step\":" << s << ",\"mask\":\"" << base64(words) << "\",\"token\":" << pick
                  << "}\n";
        if (!m.accept_token(pick)) {
          std::cerr << "mask_walk: token " << pick << " was in the mask but not accepted\n";
          return 1;
        }
      }
    }
  } catch (const Error& e) {
    std::cerr << "mask_walk: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
