// evaluate: the mean next-token cross-entropy of a checkpoint (--checkpoint) or a published model
// (--model) over a text file, in windows (windowed_loss, examples/training/batches.h); prints one
// JSON line {"loss", "perplexity", "tokens"}, plus "bits_per_char" for a character model.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/loaded_model.h"
#include "cli/program.h"
#include "training/batches.h"
#include "training/corpus.h"

using namespace tapegrad;
using namespace tapegrad::examples;

int main(int argc, char** argv) {
  CLI::App app{
      "Evaluates a model on a text: mean next-token cross-entropy (nats) over windows, printed as one JSON line.",
      "evaluate"};
  ModelSource source;
  std::string data;
  std::size_t limit = 0, window = 0;
  // Required options are checked after parsing, so that an unknown flag is the error reported first.
  source.add_options(app);
  source.add_lora_option(app);
  source.add_weights_option(app);
  source.add_cache_option(app);
  app.add_option("--data", data, "Text to evaluate on, UTF-8 (required)");
  app.add_option("--limit", limit, "Use only the first N tokens of the text (0: all)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--window", window,
                 "Tokens per window (default: the model's max_len, at most 1024 for a published model)")
      ->check(non_negative());

  return run_program(app, argc, argv, [&] {
    if (data.empty()) throw UsageError("--data is required");
    if (app.count("--limit") && limit < 2) throw UsageError(fmt::format("--limit must be at least 2, got {}", limit));
    if (app.count("--window") && window < 1) throw UsageError("--window must be at least 1");
    LoadedModel loaded = source.load();
    const std::size_t max_len = loaded.model.config().max_len;
    if (window > max_len)
      throw UsageError(fmt::format("--window {} exceeds the model's max_len {}", window, max_len));
    if (window == 0) window = source.model.empty() ? max_len : std::min<std::size_t>(max_len, 1024);
    std::vector<std::int32_t> ids = encode_file(data, *loaded.tokenizer, limit);
    if (ids.size() < 2)
      throw std::runtime_error(fmt::format("{}: {} token; at least 2 are needed to predict one", data, ids.size()));
    loaded.model.set_training(false);
    WindowedLoss result = source.weights == "f32" && source.kv_cache == "f32"
                              ? windowed_loss(loaded.model, ids, window)
                              : decoded_windowed_loss(loaded.model, ids, window, source.cache_type());
    nlohmann::ordered_json line = {{"loss", result.loss}, {"perplexity", std::exp(result.loss)}, {"tokens", result.tokens}};
    if (loaded.tokenizer->kind() == "char") line["bits_per_char"] = result.loss / std::log(2.0);
    fmt::print("{}\n", line.dump());
    return 0;
  });
}
