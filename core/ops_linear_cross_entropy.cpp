// linear_cross_entropy: a language model's head and its loss as one op, whose logits live a chunk
// of rows at a time (kernels::linear_cross_entropy), never whole: at SmolLM2's vocabulary of 49,152
// the logits of 1024 rows and their gradient would be 200 MB each. Its products run at the thread's
// matmul precision (core/precision.h), as matmul's.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "core/op_recording.h"
#include "core/ops.h"
#include "core/precision.h"

namespace tapegrad {

namespace {

// The logits held at once: at most this many floats (32 MiB), in chunks of equal rows.
constexpr std::size_t max_chunk_floats = std::size_t(1) << 23;

std::size_t chunk_rows_for(std::size_t rows, std::size_t vocab) {
  const std::size_t most = std::max<std::size_t>(1, max_chunk_floats / vocab);
  const std::size_t chunks = (rows + most - 1) / most;
  return (rows + chunks - 1) / chunks;
}

}  // namespace

Var linear_cross_entropy(const Var& x, const Var& weight, std::span<const std::int32_t> targets, bool transpose_weight,
                         const Var& bias) {
  const Shape &sx = x.shape(), &sw = weight.shape();
  auto fail = [&](const std::string& why) {
    return std::invalid_argument(fmt::format("linear_cross_entropy: {}; x is {}, weight is {}{}{}", why, to_string(sx),
                                             to_string(sw), transpose_weight ? " (transposed)" : "",
                                             bias.defined() ? ", bias is " + to_string(bias.shape()) : ""));
  };
  if (sx.empty() || sw.size() != 2) throw fail("expected x (.., D) and a 2-D weight");
  const std::size_t dim = sx.back(), vocab = transpose_weight ? sw[0] : sw[1];
  if ((transpose_weight ? sw[1] : sw[0]) != dim) throw fail("the weight's input size is not x's last size");
  if (bias.defined() && bias.shape() != Shape{vocab}) throw fail("the bias is not (V)");
  const std::size_t rows = x.value().size() / std::max<std::size_t>(dim, 1);
  if (rows == 0 || vocab == 0) throw fail("no rows or no classes");
  if (targets.size() != rows) throw fail(fmt::format("{} rows but {} targets", rows, targets.size()));
  for (std::size_t i = 0; i < rows; ++i)
    if (targets[i] < 0 || std::size_t(targets[i]) >= vocab)
      throw std::out_of_range(fmt::format("linear_cross_entropy: target {} at index {} is outside the vocabulary of "
                                          "size {}",
                                          targets[i], i, vocab));

  std::vector<Var> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  Op op("linear_cross_entropy", inputs);
  // The gradients are made with the logits, while each chunk is at hand (the loss is the last op:
  // backward only scales them by d result): x's, the weight's and the bias's sizes are saved.
  auto fresh = [&](const Var& v) {
    return op.recording() && v.defined() && v.requires_grad() ? Tensor::uninitialized(v.shape()) : Tensor();
  };
  Tensor dx = fresh(x), dweight = fresh(weight), dbias = fresh(bias);
  const std::size_t chunk_rows = chunk_rows_for(rows, vocab);
  Tensor scratch = Tensor::uninitialized({chunk_rows, vocab});  // a chunk's logits, then their gradient
  auto data = [](Tensor& t) { return t.empty() ? nullptr : t.data(); };
  const float loss = kernels::linear_cross_entropy(
      data(dx), data(dweight), data(dbias), x.value().data(), weight.value().data(),
      bias.defined() ? bias.value().data() : nullptr, targets.data(), rows, dim, vocab, transpose_weight, chunk_rows,
      scratch.data(), /*overwrite=*/true, /*bf16_products=*/matmul_precision() == Precision::bf16);
  scratch = Tensor();
  const std::size_t bytes = dx.bytes() + dweight.bytes() + dbias.bytes();
  // d input += d result * (d loss / d input), the latter computed above.
  return op.finish(Tensor::scalar(loss), [x, weight, bias, dx = std::move(dx), dweight = std::move(dweight),
                                          dbias = std::move(dbias)](const Tensor& dy, const Tensor&) {
    auto hand_over = [&](const Var& input, const Tensor& saved) {
      if (saved.empty()) return;
      const GradTarget g = grad_target(input);
      if (!g.data) return;
      if (g.overwrite) kernels::scale_forward(g.data, saved.data(), dy[0], saved.size());
      else kernels::scale_backward(g.data, saved.data(), dy[0], saved.size());
    };
    hand_over(x, dx);
    hand_over(weight, dweight);
    if (bias.defined()) hand_over(bias, dbias);
  }, bytes);
}

}  // namespace tapegrad
