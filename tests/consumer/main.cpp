// Uses an installed tapegrad: one training step of a small decoder and a few greedy tokens, and
// the custom op of docs/custom-ops.md with its checks. Prints "ok" and exits 0 when the loss is
// finite, generation produced what was asked and every check of the custom op passed.
#include <cmath>
#include <cstdio>

#include "core/tape.h"
#include "custom_op.h"
#include "nn/generate.h"
#include "nn/models/rotary_decoder.h"
#include "optim/adamw.h"
#include "tokenizers/char_tokenizer.h"

using namespace tapegrad;

int main() {
  tokenizers::CharTokenizer tokenizer = tokenizers::CharTokenizer::from_text("hello, installed tapegrad");
  nn::RotaryDecoder model = nn::rotary_decoder(tokenizer.size(), 16, 2, 1, 16);
  optim::AdamW optimizer(model.params());
  std::vector<std::int32_t> ids = tokenizer.encode("hello, installed");
  std::vector<std::int32_t> inputs(ids.begin(), ids.end() - 1), targets(ids.begin() + 1, ids.end());
  Tape tape;
  Var loss = model.loss(inputs, targets, 1, inputs.size());
  tape.backward(loss);
  optimizer.step();
  nn::Generation out = nn::generate(model, tokenizer.encode("he"), {.max_new = 5, .sampling = {.temperature = 0.0f}});
  std::vector<std::string> failures = custom_op_example::check_cubic();
  for (const std::string& failure : failures) std::printf("custom op: %s\n", failure.c_str());
  const bool ok = std::isfinite(loss.value().item()) && out.tokens.size() == 5 && failures.empty();
  std::printf("%s: loss %.4f, generated \"%s\"\n", ok ? "ok" : "FAILED", loss.value().item(),
              tokenizer.decode(out.tokens).c_str());
  return ok ? 0 : 1;
}
