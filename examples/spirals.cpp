// spirals: the first model to read. An MLP learns to separate two interleaved spirals generated
// here, with tapegrad's public API only: a module, ops, a Tape, AdamW.
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "core/ops.h"
#include "core/random.h"
#include "nn/linear.h"
#include "optim/adamw.h"

using namespace tapegrad;

// n points of each class: class c at angle 3.5 pi t + c pi and radius t, t in (0, 1], plus noise.
// xy (2n, 2) holds the points, label[i] their classes.
void make_spirals(std::size_t n, Rng& rng, Tensor& xy, std::vector<std::int32_t>& label) {
  xy = Tensor({2 * n, 2});
  label.assign(2 * n, 0);
  for (std::size_t i = 0; i < 2 * n; ++i) {
    float t = rng.uniform() * 0.95f + 0.05f, angle = 3.5f * 3.14159265f * t + float(i % 2) * 3.14159265f;
    xy[2 * i] = t * std::cos(angle) + 0.02f * rng.normal();
    xy[2 * i + 1] = t * std::sin(angle) + 0.02f * rng.normal();
    label[i] = std::int32_t(i % 2);
  }
}

// 2 -> 64 -> 64 -> 2 with tanh: logits of the two classes.
struct Mlp : nn::Module {
  nn::Linear l1, l2, l3;
  explicit Mlp(Rng& rng) : l1(2, 64, true, 1.0f, rng), l2(64, 64, true, 0.15f, rng), l3(64, 2, true, 0.15f, rng) {}
  Var forward(const Var& x) const { return l3.forward(tanh(l2.forward(tanh(l1.forward(x))))); }
  void members(nn::Members& m) override {
    m("l1", l1);
    m("l2", l2);
    m("l3", l3);
  }
};

double accuracy(const Mlp& model, const Tensor& xy, const std::vector<std::int32_t>& label) {
  NoGradScope no_grad;
  Tensor logits = model.forward(Var(xy)).value();  // (N, 2)
  std::size_t right = 0;
  for (std::size_t i = 0; i < label.size(); ++i) right += (logits[2 * i + 1] > logits[2 * i]) == (label[i] == 1);
  return double(right) / double(label.size());
}

int main() {
  Rng rng(0);
  Tensor train_xy, test_xy;
  std::vector<std::int32_t> train_label, test_label;
  make_spirals(300, rng, train_xy, train_label);
  make_spirals(200, rng, test_xy, test_label);
  Mlp model(rng);
  optim::AdamW optimizer(model.params(), {.lr = 1e-2f, .weight_decay = 0.0f});
  for (int step = 1; step <= 200; ++step) {
    optimizer.zero_grad();
    Tape tape;
    Var loss = cross_entropy(model.forward(Var(train_xy)), train_label);
    tape.backward(loss);
    optimizer.step();
    if (step % 50 == 0)
      fmt::print("step {:4d}  loss {:.4f}  train accuracy {:.3f}\n", step, loss.value().item(),
                 accuracy(model, train_xy, train_label));
  }
  fmt::print("test accuracy: {:.3f}\n", accuracy(model, test_xy, test_label));
}
