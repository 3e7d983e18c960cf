// generate: text from a train checkpoint (--checkpoint) or a published model (--model: a GGUF
// file or a Hugging Face folder). One sample streams: standard output carries the prompt and then
// the generated text as it comes, up to the model's end-of-text token. --chat wraps the prompt
// in the model's chat template and prints only the reply; with no --prompt on a terminal it is a
// conversation. --num-samples N decodes N samples as one batch (sample i is what --seed S+i alone
// gives), printed one after another, each followed by a line "---", or with --jsonl one JSON
// object per line. Notes go to standard error.
#include "nn/generate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/loaded_model.h"
#include "cli/program.h"
#include "tokenizers/char_tokenizer.h"
#include "tokenizers/utf8_stream.h"

using namespace tapegrad;
using namespace tapegrad::examples;

namespace {

void write_out(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// One sample, its text streamed to standard output whole characters at a time.
nn::Generation stream_one(const LoadedModel& loaded, std::span<const std::int32_t> ids,
                          const nn::GenerateOptions& options) {
  tokenizers::Utf8Stream text;
  auto print_token = [&](std::size_t, std::int32_t token) { write_out(text.push(loaded.tokenizer->token_bytes(token))); };
  nn::Generation generation = std::move(nn::generate_samples(loaded.model, ids, 1, options, print_token).front());
  write_out(text.flush());
  return generation;
}

// A conversation on the terminal: each line typed is a user message; the reply streams.
void converse(const LoadedModel& loaded, const tokenizers::ChatTemplate& chat,
              std::vector<tokenizers::ChatMessage> messages, nn::GenerateOptions options) {
  fmt::print(stderr, "Chatting with {} ({} template); an empty line or Ctrl-D ends.\n", loaded.path, chat.name());
  for (std::string line;;) {
    fmt::print(stderr, "> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    messages.push_back({"user", line});
    const std::vector<std::int32_t> ids = loaded.tokenizer->encode(chat.render(messages, true));
    if (ids.size() >= loaded.model.config().max_len) {
      fmt::print(stderr, "generate: the conversation has reached the model's max_len {}\n", loaded.model.config().max_len);
      break;
    }
    const nn::Generation reply = stream_one(loaded, ids, options);
    write_out("\n");
    messages.push_back({"assistant", loaded.tokenizer->decode(reply.tokens)});
    ++options.seed;  // each turn draws afresh
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Generates text from a checkpoint written by train or from a published model (GGUF or Hugging Face). "
      "Standard output carries the prompt followed by the generated text and nothing else (--chat: the reply "
      "only); notes go to standard error.",
      "generate"};
  ModelSource source;
  std::string prompt, system, chat_template;
  nn::GenerateOptions options{.max_new = 200, .sampling = {.temperature = 0.8f}};
  bool no_cache = false, jsonl = false, chat = false, ignore_eos = false;
  std::size_t num_samples = 1;
  // Required options are checked after parsing, so that an unknown flag is the error reported first.
  source.add_options(app);
  source.add_lora_option(app);
  source.add_weights_option(app);
  source.add_cache_option(app);
  app.add_option("--prompt", prompt,
                 "Text to continue (default for checkpoints: a newline if the vocabulary has one, else its first "
                 "character); with --chat, the user's message");
  app.add_flag("--chat", chat,
               "Wrap --prompt as one user message in the model's chat template and print only the reply; with no "
               "--prompt on a terminal, a conversation");
  app.add_option("--system", system, "With --chat: a system message first");
  app.add_option("--chat-template", chat_template,
                 "The chat template: chatml, llama3 or a file holding one (default: the model's own)");
  app.add_option("--max-new", options.max_new, "Tokens to generate (fewer at an end-of-text token or max_len)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_flag("--ignore-eos", ignore_eos, "Do not stop at the model's end-of-text tokens: generate --max-new tokens");
  app.add_option("--temperature", options.sampling.temperature, "Softmax temperature (0: greedy)")
      ->capture_default_str();
  app.add_option("--top-k", options.sampling.top_k, "Keep the k most probable tokens (0: all)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--top-p", options.sampling.top_p, "Keep the smallest most probable set reaching p (1: all)")
      ->capture_default_str();
  app.add_option("--seed", options.seed, "Seed of the sampler")->check(non_negative())->capture_default_str();
  app.add_flag("--no-cache", no_cache, "Run the full forward for every token instead of the KV cache (same text)");
  app.add_option("--num-samples", num_samples,
                 "Samples to decode together as one batch (at most 65536); sample i is the text --seed S+i "
                 "gives alone")
      ->check(CLI::Range(std::size_t(1), std::size_t(65536)))
      ->capture_default_str();
  app.add_flag("--jsonl", jsonl,
               "Print one JSON object per sample and line: {\"sample\", \"seed\", \"text\", \"ids\"}");

  return run_program(app, argc, argv, [&] {
    try {
      options.sampling.validate();
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    if (!chat && (app.count("--system") || app.count("--chat-template")))
      throw UsageError("--system and --chat-template go with --chat");
    options.use_cache = !no_cache;
    options.cache_type = source.cache_type();
    if (no_cache && options.cache_type != nn::KVCacheType::f32) throw UsageError("--kv-cache goes without --no-cache");
    LoadedModel loaded = source.load();
    const tokenizers::Tokenizer& tokenizer = *loaded.tokenizer;
    if (!ignore_eos) options.stop_ids = tokenizer.end_ids();
    loaded.model.set_training(false);  // no dropout in generation

    std::vector<tokenizers::ChatMessage> messages;
    std::optional<tokenizers::ChatTemplate> chat_format;
    if (chat) {
      chat_format = chat_template_of(loaded, chat_template);
      if (!system.empty()) messages.push_back({"system", system});
      if (!app.count("--prompt")) {
        if (!::isatty(STDIN_FILENO)) throw UsageError("--chat needs --prompt when standard input is not a terminal");
        if (num_samples > 1 || jsonl) throw UsageError("a conversation (--chat without --prompt) takes one sample, without --jsonl");
        converse(loaded, *chat_format, std::move(messages), options);
        return 0;
      }
    } else if (!app.count("--prompt")) {
      // Only a character vocabulary has an obvious first text (a newline); a BPE model's has none.
      auto* chars = dynamic_cast<const tokenizers::CharTokenizer*>(&tokenizer);
      if (!chars) throw UsageError("--prompt is required with a BPE model (or --chat for a conversation)");
      const std::string vocab = chars->vocab();
      prompt = vocab.find('\n') != std::string::npos ? "\n" : tokenizer.decode(std::vector<std::int32_t>{0});
    }
    if (prompt.empty()) throw UsageError("--prompt is empty; give at least one character, or omit --prompt");
    std::vector<std::int32_t> ids;
    try {
      if (chat) {
        messages.push_back({"user", prompt});
        ids = tokenizer.encode(chat_format->render(messages, true));
      } else {
        ids = encode_prompt(tokenizer, prompt);
      }
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("--prompt: {} (the tokenizer of {})", e.what(), loaded.path));
    }
    const std::size_t max_len = loaded.model.config().max_len;
    if (ids.size() > max_len)
      throw UsageError(fmt::format("--prompt has {} tokens, more than the model's max_len {} ({})", ids.size(), max_len,
                                   loaded.path));
    const std::string echo = chat ? "" : prompt;  // what standard output carries before the new text
    std::vector<nn::Generation> samples;
    if (num_samples == 1 && !jsonl) {  // stream the text as it comes
      write_out(echo);
      samples.push_back(stream_one(loaded, ids, options));
      if (chat) write_out("\n");
    } else {
      samples = nn::generate_samples(loaded.model, ids, num_samples, options);
      for (std::size_t i = 0; i < samples.size(); ++i) {
        const std::string text = echo + tokenizer.decode(samples[i].tokens);
        if (!jsonl) {
          fmt::print("{}\n---\n", text);
          continue;
        }
        const nlohmann::json line = {
            {"sample", i}, {"seed", options.seed + i}, {"text", text}, {"ids", samples[i].tokens}};
        fmt::print("{}\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      }
      std::fflush(stdout);
    }
    const nn::Generation& generation = samples.front();
    if (generation.stopped_at_max_len) {
      // On a terminal the note starts on a line of its own (the text ends without a newline).
      const char* lead = ::isatty(STDOUT_FILENO) && ::isatty(STDERR_FILENO) ? "\n" : "";
      fmt::print(stderr, "{}generate: stopped at max_len {} after {} of {} tokens\n", lead, max_len,
                 generation.tokens.size(), options.max_new);
    }
    return 0;
  });
}
