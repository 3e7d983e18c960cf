// generate: text from a train_char checkpoint of any registered architecture. One sample streams: standard
// output carries the prompt and then each generated character as it comes. --num-samples N
// decodes N samples as one batch (sample i is what --seed S+i alone gives) and prints them one
// after another, each followed by a line "---", or with --jsonl one JSON object per line. Notes
// go to standard error.
#include "nn/generate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/program.h"
#include "nn/checkpoint.h"
#include "nn/language_model.h"

using namespace tapegrad;
using namespace tapegrad::examples;

int main(int argc, char** argv) {
  CLI::App app{
      "Generates text from a checkpoint written by train_char. Standard output carries the prompt "
      "followed by the generated characters and nothing else; notes go to standard error.",
      "generate"};
  std::string checkpoint, prompt;
  nn::GenerateOptions options{.max_new = 200, .sampling = {.temperature = 0.8f}};
  bool no_cache = false, jsonl = false;
  std::size_t num_samples = 1;
  // Required options are checked after parsing, so that an unknown flag is the error reported first.
  app.add_option("--checkpoint", checkpoint, "A checkpoint from train_char (required)");
  app.add_option("--prompt", prompt,
                 "Text to continue (default: a newline if the vocabulary has one, else its "
                 "first character)");
  app.add_option("--max-new", options.max_new, "Characters to generate (fewer when the text reaches max_len)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--temperature", options.sampling.temperature, "Softmax temperature (0: greedy)")
      ->capture_default_str();
  app.add_option("--top-k", options.sampling.top_k, "Keep the k most probable characters (0: all)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--top-p", options.sampling.top_p, "Keep the smallest most probable set reaching p (1: all)")
      ->capture_default_str();
  app.add_option("--seed", options.seed, "Seed of the sampler")->check(non_negative())->capture_default_str();
  app.add_flag("--no-cache", no_cache, "Run the full forward for every character instead of the KV cache (same text)");
  app.add_option("--num-samples", num_samples,
                 "Samples to decode together as one batch (at most 65536); sample i is the text --seed S+i "
                 "gives alone")
      ->check(CLI::Range(std::size_t(1), std::size_t(65536)))
      ->capture_default_str();
  app.add_flag("--jsonl", jsonl, "Print one JSON object per sample and line: {\"sample\", \"seed\", \"text\"}");

  return run_program(app, argc, argv, [&] {
    if (checkpoint.empty()) throw UsageError("--checkpoint is required");
    try {
      options.sampling.validate();
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    options.use_cache = !no_cache;
    nn::LoadedModelCheckpoint ckpt = nn::load_model_checkpoint(checkpoint);  // any registered arch
    const nn::CharTokenizer& tokenizer = ckpt.tokenizer;
    if (!app.count("--prompt")) {
      const std::string vocab = tokenizer.vocab();
      prompt = vocab.find('\n') != std::string::npos ? "\n" : tokenizer.decode(std::vector<std::int32_t>{0});
    }
    if (prompt.empty()) throw UsageError("--prompt is empty; give at least one character, or omit --prompt");
    std::vector<std::int32_t> ids;
    try {
      ids = tokenizer.encode(prompt);
    } catch (const std::exception& e) {
      throw UsageError(fmt::format("--prompt: {} of {}", e.what(), checkpoint));
    }
    const std::size_t max_len = ckpt.model.config().max_len;
    if (ids.size() > max_len)
      throw UsageError(fmt::format("--prompt has {} characters, more than the model's max_len {} ({})", ids.size(),
                                   max_len, checkpoint));
    ckpt.model.set_training(false);  // no dropout in generation
    std::vector<nn::Generation> samples;
    if (num_samples == 1 && !jsonl) {  // stream each character as it comes
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      std::fflush(stdout);
      auto print_token = [&](std::size_t, std::int32_t token) {
        const std::string piece = tokenizer.decode(std::span(&token, 1));
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      };
      samples = nn::generate_samples(ckpt.model, ids, 1, options, print_token);
    } else {
      samples = nn::generate_samples(ckpt.model, ids, num_samples, options);
      for (std::size_t i = 0; i < samples.size(); ++i) {
        const std::string text = prompt + tokenizer.decode(samples[i].tokens);
        if (!jsonl) {
          fmt::print("{}\n---\n", text);
          continue;
        }
        const nlohmann::json line = {{"sample", i}, {"seed", options.seed + i}, {"text", text}};
        fmt::print("{}\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      }
      std::fflush(stdout);
    }
    const nn::Generation& generation = samples.front();
    if (generation.stopped_at_max_len) {
      // On a terminal the note starts on a line of its own (the text ends without a newline).
      const char* lead = ::isatty(STDOUT_FILENO) && ::isatty(STDERR_FILENO) ? "\n" : "";
      fmt::print(stderr, "{}generate: stopped at max_len {} after {} of {} characters\n", lead, max_len,
                 generation.tokens.size(), options.max_new);
    }
    return 0;
  });
}
