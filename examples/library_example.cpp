// library_example: tapegrad used as a library, in one page: a tokenizer and a rotary decoder,
// AdamW on random windows of a built-in text, then greedy generation through the KV cache.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "core/random.h"
#include "core/tape.h"
#include "nn/generate.h"
#include "nn/models/rotary_decoder.h"
#include "optim/adamw.h"
#include "tokenizers/char_tokenizer.h"

using namespace tapegrad;

int main() {
  const std::string text = "the quick brown fox jumps over the lazy dog. ";
  std::string corpus;
  for (int i = 0; i < 20; ++i) corpus += text;

  tokenizers::CharTokenizer tokenizer = tokenizers::CharTokenizer::from_text(corpus);
  std::vector<std::int32_t> ids = tokenizer.encode(corpus);
  nn::RotaryDecoder model(
      {.vocab = tokenizer.size(), .d_model = 32, .n_heads = 2, .n_blocks = 2, .max_len = 64, .seed = 0});
  fmt::print("{} with {} parameters\n", model, model.num_params());

  optim::AdamW optimizer(model.params(), {.lr = 3e-3f, .beta2 = 0.95f, .weight_decay = 0.1f});
  const std::size_t batch = 8, seq_len = 32;
  Rng rng(1);
  for (int step = 1; step <= 150; ++step) {
    std::vector<std::int32_t> inputs, targets;  // (B, T) windows: targets are the inputs shifted by one
    for (std::size_t b = 0; b < batch; ++b) {
      const std::size_t start = rng.below(ids.size() - seq_len);
      inputs.insert(inputs.end(), ids.begin() + start, ids.begin() + start + seq_len);
      targets.insert(targets.end(), ids.begin() + start + 1, ids.begin() + start + seq_len + 1);
    }
    Tape tape;  // records the forward; backward fills every parameter's gradient
    Var loss = model.loss(inputs, targets, batch, seq_len);
    tape.backward(loss);
    optimizer.step();
    optimizer.zero_grad();
    if (step % 50 == 0) fmt::print("step {}: loss {:.3f}\n", step, loss.value().item());
  }

  nn::GenerateOptions options{.max_new = 40, .sampling = {.temperature = 0.0f}};  // greedy
  nn::Generation out = nn::generate(model, tokenizer.encode("the "), options);
  fmt::print("the {}\n", tokenizer.decode(out.tokens));
}
