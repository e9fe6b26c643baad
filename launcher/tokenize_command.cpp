// `tandem tokenize`: the model's tokenizer as a filter over stdin, one JSON
// value per line in, one per line out. A user-facing tool and the hook that
// tests compare against Hugging Face's own `tokenizers`. A bad line becomes
// `null` in the output (so lines stay aligned) and one message on stderr; the
// exit status is then 1.
#include <iostream>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "launcher/commands.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem::launcher {
namespace {

struct TokenizeOptions {
  std::string model;
  bool add_special = false;
  bool decode = false;
  bool skip_special = false;
  bool stream = false;
  bool chat = false;
  std::string chat_template = "auto";
  bool no_generation_prompt = false;
};

std::string dump(const nlohmann::json& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// One conversation: [{"role":..,"content":..}, ...] or {"messages": [...]}.
std::optional<std::vector<runtime::ChatMessage>> parse_messages(const nlohmann::json& v) {
  const nlohmann::json& list = v.is_object() && v.contains("messages") ? v["messages"] : v;
  if (!list.is_array()) return std::nullopt;
  std::vector<runtime::ChatMessage> out;
  for (const auto& m : list) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      return std::nullopt;
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>(), std::nullopt});
  }
  return out;
}

// The ids of a line like [1, 2, 3], or nullopt when it is not one.
std::optional<std::vector<int32_t>> parse_ids(const nlohmann::json& v, int32_t vocab_size) {
  if (!v.is_array()) return std::nullopt;
  std::vector<int32_t> ids;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab_size) return std::nullopt;
    ids.push_back(x.get<int32_t>());
  }
  return ids;
}

int run_tokenize(const TokenizeOptions& o) {
  auto tok = runtime::Tokenizer::load(o.model);
  std::optional<runtime::ChatTemplate> chat;
  if (o.chat) chat = runtime::ChatTemplate::select(o.chat_template, tok->config(), o.model + "/tokenizer_config.json");
  std::ios::sync_with_stdio(false);

  long lineno = 0, bad = 0;
  auto reject = [&](const std::string& why) {
    std::cerr << "tandem tokenize: stdin:" << lineno << ": " << why << "; wrote null\n";
    std::cout << "null\n";
    ++bad;
  };
  std::string line;
  while (std::getline(std::cin, line)) {
    ++lineno;
    nlohmann::json v = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (chat) {
      auto messages = parse_messages(v);
      if (!messages) {
        reject("expected a JSON array of {\"role\", \"content\"} messages");
        continue;
      }
      runtime::ChatOptions options;
      options.add_generation_prompt = !o.no_generation_prompt;
      try {
        std::cout << dump(chat->render(*messages, options)) << '\n';
      } catch (const Error& e) {
        reject(e.what());
      }
    } else if (o.decode) {
      auto ids = parse_ids(v, tok->vocab_size());
      if (!ids) {
        reject("expected a JSON array of token ids below " + std::to_string(tok->vocab_size()));
        continue;
      }
      if (o.stream) {
        runtime::StreamDecoder dec(*tok, o.skip_special);
        nlohmann::json chunks = nlohmann::json::array();
        for (int32_t id : *ids) chunks.push_back(dec.push(id));
        chunks.push_back(dec.finish());
        std::cout << dump(chunks) << '\n';
      } else {
        std::cout << dump(tok->decode(*ids, o.skip_special)) << '\n';
      }
    } else {
      if (!v.is_string()) {
        reject("expected a JSON string such as \"Hello\"");
        continue;
      }
      const auto ids = tok->encode(v.get_ref<const std::string&>(), o.add_special);
      std::string out = "[";
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(ids[i]);
      }
      out += "]\n";
      std::cout << out;
    }
  }
  std::cout.flush();
  return bad == 0 ? 0 : 1;
}

}  // namespace

Action add_tokenize_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "tokenize", "Encode JSON strings from stdin into token ids, one JSON value per line (or decode, or render chats)");
  auto o = std::make_shared<TokenizeOptions>();
  cmd->add_option("--model", o->model, "Model directory with tokenizer.json")->required();
  cmd->add_flag("--add-special-tokens", o->add_special, "Add the model's BOS/EOS as its post-processor says");
  auto* decode = cmd->add_flag("--decode", o->decode, "Read JSON arrays of ids and write JSON strings");
  cmd->add_flag("--skip-special-tokens", o->skip_special, "With --decode: leave special tokens out");
  cmd->add_flag("--stream", o->stream,
                "With --decode: decode one id at a time as a stream would; write the JSON array of chunks");
  cmd->add_flag("--chat", o->chat,
                "Read conversations (JSON arrays of {role, content}) and write the prompt text the chat template makes")
      ->excludes(decode);
  cmd->add_option("--chat-template", o->chat_template, "With --chat: auto, chatml, llama3, llama3.1 or mistral (as model.chat_template)")
      ->check(CLI::IsMember({"auto", "chatml", "llama3", "llama3.1", "mistral"}));
  cmd->add_flag("--no-generation-prompt", o->no_generation_prompt, "With --chat: do not open an assistant turn");
  return [o]() { return run_tokenize(*o); };
}

}  // namespace tandem::launcher
