#include "router/prompt_builder.h"

#include "common/error.h"
#include "router/structured_output.h"
#include "router/tool_calls.h"
#include "runtime/tokenizer/py_json.h"

namespace tandem::router {

namespace {

// The grammar of the answer (unless a structured output gives one, with
// tool_choice "none") and how to read its calls: both by the model's format.
void settle_tools(BatchRequest& req, const runtime::ChatTemplate& chat, const runtime::Tokenizer& tokenizer) {
  const ToolRequest& t = *req.tools;
  req.tool_format = chat.tool_format();
  if (req.tool_format == runtime::ToolFormat::kMistral) req.tool_marker = tokenizer.token_to_id("[TOOL_CALLS]");
  if (!req.params.grammar.empty()) return;
  const bool think_first = chat.family() == runtime::ChatTemplate::Family::kQwen3 && req.enable_thinking != false;
  const std::string key = "tools\n" + std::to_string(static_cast<int>(req.tool_format)) + " " +
                          std::to_string(static_cast<int>(t.choice)) + " " + t.named + " " +
                          std::to_string(t.parallel) + std::to_string(think_first) + " " + std::to_string(req.tool_marker) +
                          "\n" + runtime::py_json_dumps(t.tools);
  req.params.grammar =
      checked_ebnf("tools", key, [&] { return tool_grammar(req.tool_format, t, think_first, req.tool_marker); });
}

}  // namespace

namespace {

// Embeddings: every input tokenized (texts with the tokenizer's special
// tokens, as sentence-transformers encodes them) into req.input_ids, each
// within the context; the ids of all of them, in order, come back.
std::variant<std::vector<int32_t>, LineError> build_embedding_inputs(BatchRequest& req, const PromptContext& ctx) {
  LineError err{req.custom_id, 400, ""};
  if (req.input_texts) {
    req.input_ids.clear();
    for (const auto& text : *req.input_texts) req.input_ids.push_back(ctx.tokenizer->encode(text, true));
  }
  if (req.dimensions > ctx.hidden && ctx.hidden > 0) {
    err.message = "'dimensions' is " + std::to_string(req.dimensions) + " but the model's embeddings have " +
                  std::to_string(ctx.hidden) + "; ask for at most that many";
    return err;
  }
  std::vector<int32_t> all;
  for (std::size_t i = 0; i < req.input_ids.size(); ++i) {
    const auto& ids = req.input_ids[i];
    const std::string which = req.input_ids.size() == 1 ? "the input" : "input " + std::to_string(i);
    for (int32_t t : ids) {
      if (t >= ctx.vocab_size) {
        err.message = which + ": token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                      std::to_string(ctx.vocab_size - 1) + ")";
        return err;
      }
    }
    if (ids.empty()) {
      err.message = which + " has no tokens";
      return err;
    }
    if (static_cast<int64_t>(ids.size()) > ctx.max_model_len) {
      err.message = which + " has " + std::to_string(ids.size()) + " tokens but the model's context holds " +
                    std::to_string(ctx.max_model_len) + "; shorten it";
      return err;
    }
    all.insert(all.end(), ids.begin(), ids.end());
  }
  return all;
}

}  // namespace

std::variant<std::vector<int32_t>, LineError> build_prompt(BatchRequest& req, const PromptContext& ctx) {
  if (req.endpoint == Endpoint::kEmbeddings) return build_embedding_inputs(req, ctx);
  LineError err{req.custom_id, 400, ""};
  std::vector<int32_t> ids;
  if (req.prompt_ids) {
    ids = *req.prompt_ids;
    for (int32_t t : ids) {
      if (t >= ctx.vocab_size) {
        err.message = "token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                      std::to_string(ctx.vocab_size - 1) + ")";
        return err;
      }
    }
  } else if (req.messages) {
    if (!ctx.chat) {
      err.message = "chat requests need a chat template: " + ctx.chat_error;
      return err;
    }
    try {
      runtime::ChatOptions options;
      options.enable_thinking = req.enable_thinking;
      options.date_string = req.date_string;
      if (req.tools) options.tools = &req.tools->tools;
      ids = ctx.tokenizer->encode(ctx.chat->render(*req.messages, options), false);
      if (req.tools) settle_tools(req, *ctx.chat, *ctx.tokenizer);
    } catch (const Error& e) {
      err.message = e.what();
      return err;
    }
  } else {
    ids = ctx.tokenizer->encode(*req.prompt_text, true);
  }
  const auto n = static_cast<int64_t>(ids.size());
  if (n == 0) {
    err.message = "the prompt is empty";
    return err;
  }
  if (n >= ctx.max_model_len) {
    err.message = "the prompt has " + std::to_string(n) + " tokens but the model's context holds " +
                  std::to_string(ctx.max_model_len) + " (prompt and completion together); shorten the prompt";
    return err;
  }
  const int64_t room = ctx.max_model_len - n;
  if (!req.max_tokens_given && req.endpoint == Endpoint::kChat) req.params.max_tokens = room;
  if (req.params.max_tokens > room) {
    if (req.max_tokens_given) {
      err.message = "max_tokens " + std::to_string(req.params.max_tokens) + " plus the prompt's " + std::to_string(n) +
                    " tokens exceeds the model's context of " + std::to_string(ctx.max_model_len) +
                    " tokens; lower max_tokens to at most " + std::to_string(room);
      return err;
    }
    req.params.max_tokens = room;
  }
  return ids;
}

}  // namespace tandem::router
