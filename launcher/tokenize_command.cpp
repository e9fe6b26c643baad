// `tandem tokenize`: the model's tokenizer as a filter over stdin, one JSON
// value per line. A user-facing tool and the hook that tests compare against
// Hugging Face's own `tokenizers`.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "launcher/commands.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem::launcher {
namespace {

struct TokenizeOptions {
  std::string model;
  bool add_special = false;
  bool decode = false;
  bool skip_special = false;
  bool stream = false;
};

int run_tokenize(const TokenizeOptions& o) {
  auto tok = runtime::Tokenizer::load(o.model);
  std::ios::sync_with_stdio(false);
  std::string line, out;
  long lineno = 0, bad = 0;
  while (std::getline(std::cin, line)) {
    ++lineno;
    nlohmann::json v;
    try {
      v = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error&) {
      v = nullptr;
    }
    if (!o.decode) {
      if (!v.is_string()) {
        std::cerr << "tandem tokenize: stdin:" << lineno << ": expected a JSON string such as \"Hello\"; wrote null\n";
        ++bad;
        std::cout << "null\n";
        continue;
      }
      const auto ids = tok->encode(v.get_ref<const std::string&>(), o.add_special);
      out.clear();
      out += '[';
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(ids[i]);
      }
      out += "]\n";
      std::cout << out;
      continue;
    }
    std::vector<int32_t> ids;
    bool ok = v.is_array();
    for (const auto& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok->vocab_size()) {
        ok = false;
        break;
      }
      ids.push_back(x.get<int32_t>());
    }
    if (!ok) {
      std::cerr << "tandem tokenize: stdin:" << lineno << ": expected a JSON array of token ids below "
                << tok->vocab_size() << "; wrote null\n";
      ++bad;
      std::cout << "null\n";
      continue;
    }
    if (o.stream) {
      runtime::StreamDecoder dec(*tok, o.skip_special);
      nlohmann::json chunks = nlohmann::json::array();
      for (int32_t id : ids) chunks.push_back(dec.push(id));
      chunks.push_back(dec.finish());
      std::cout << chunks.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    } else {
      std::cout << nlohmann::json(tok->decode(ids, o.skip_special)).dump(-1, ' ', false,
                                                                          nlohmann::json::error_handler_t::replace)
                << '\n';
    }
  }
  std::cout.flush();
  return bad == 0 ? 0 : 1;
}

}  // namespace

Action add_tokenize_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("tokenize",
                                  "Encode JSON strings from stdin to token ids (one JSON value per line), or decode");
  auto o = std::make_shared<TokenizeOptions>();
  cmd->add_option("--model", o->model, "Model directory with tokenizer.json")->required();
  cmd->add_flag("--add-special-tokens", o->add_special, "Add the model's BOS/EOS as its post-processor says");
  cmd->add_flag("--decode", o->decode, "Read JSON arrays of ids and write JSON strings");
  cmd->add_flag("--skip-special-tokens", o->skip_special, "With --decode: leave special tokens out");
  cmd->add_flag("--stream", o->stream,
                "With --decode: decode one id at a time as a stream would; write the JSON array of chunks");
  return [o]() { return run_tokenize(*o); };
}

}  // namespace tandem::launcher
