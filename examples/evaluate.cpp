// evaluate: the mean next-character cross-entropy of a checkpoint over a text file, in windows
// of max_len (windowed_loss, examples/common/batches.h); prints one JSON line
// {"loss", "bits_per_char", "tokens"}.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/batches.h"
#include "common/corpus.h"
#include "common/program.h"
#include "nn/checkpoint.h"
#include "nn/language_model.h"

using namespace tapegrad;
using namespace tapegrad::examples;

int main(int argc, char** argv) {
  CLI::App app{
      "Evaluates a checkpoint on a text: mean next-character cross-entropy over windows of max_len, "
      "printed as one JSON line.",
      "evaluate"};
  std::string checkpoint, data;
  std::size_t limit = 0;
  // Required options are checked after parsing, so that an unknown flag is the error reported first.
  app.add_option("--checkpoint", checkpoint, "A checkpoint from train_char (required)");
  app.add_option("--data", data, "Text to evaluate on: UTF-8, characters of the checkpoint's vocabulary (required)");
  app.add_option("--limit", limit, "Use only the first N characters (0: all)")
      ->check(non_negative())
      ->capture_default_str();

  return run_program(app, argc, argv, [&] {
    if (checkpoint.empty()) throw UsageError("--checkpoint is required");
    if (data.empty()) throw UsageError("--data is required");
    if (app.count("--limit") && limit < 2) throw UsageError(fmt::format("--limit must be at least 2, got {}", limit));
    nn::LoadedModelCheckpoint ckpt = nn::load_model_checkpoint(checkpoint);  // any registered arch
    std::vector<std::int32_t> ids = encode_file(data, ckpt.tokenizer, limit);
    if (ids.size() < 2)
      throw std::runtime_error(fmt::format("{}: {} character; at least 2 are needed to predict one", data, ids.size()));
    WindowedLoss result = windowed_loss(ckpt.model, ids);
    nlohmann::ordered_json line = {
        {"loss", result.loss}, {"bits_per_char", result.loss / std::log(2.0)}, {"tokens", result.tokens}};
    fmt::print("{}\n", line.dump());
    return 0;
  });
}
