// Version checks on the tape: a backward refuses to run when a value its op read or made was
// changed in place since the op was recorded (PyTorch's "modified by an inplace operation").
#include <doctest/doctest.h>

#include <stdexcept>

#include "core/op_recording.h"
#include "core/ops.h"
#include "core/remat.h"
#include "support/checks.h"

using namespace tapegrad;
using test::contains;
using test::error_of;

TEST_CASE("changing a saved input in place before backward is an error naming the op and the input") {
  Var x(test::random_tensor({2, 3}, 1), true), w(test::random_tensor({3, 4}, 2), true);
  Tape tape;
  Var loss = sum(matmul(x, w));
  w.mutable_value()[0] += 1.0f;  // an optimizer step before backward: matmul's dx needs the old w
  std::string message = error_of<std::logic_error>([&] { tape.backward(loss); });
  CHECK(contains(message, "Tape::backward: matmul's input 1 of shape [3, 4] was changed in place (version 0 -> 1)"));
  CHECK(contains(message, "change it after backward"));
  // The tape is spent: backward cannot resume half-way.
  CHECK(contains(error_of([&] { tape.backward(loss); }), "this tape is spent"));
}

TEST_CASE("changing an op's output in place before backward is an error") {
  Var x(test::random_tensor({4}, 3), true);
  Tape tape;
  Var y = exp(x);  // exp's backward reads its output
  y.mutable_value()[1] = 0.0f;
  CHECK(contains(error_of<std::logic_error>([&] { tape.backward(y, Tensor({4}, 1.0f)); }),
                 "exp's output of shape [4] was changed in place (version 0 -> 1)"));
  // Consumed by another op, the same change is first seen as that op's input.
  Tape second;
  Var z = exp(x);
  Var loss = sum(z);
  z.mutable_value()[1] = 0.0f;
  CHECK(contains(error_of<std::logic_error>([&] { second.backward(loss); }), "sum's input 0 of shape [4] was changed"));
}

TEST_CASE("a rematerialised block refuses an input changed in place") {
  Var w(test::random_tensor({3, 3}, 4), true);
  Var x(test::random_tensor({2, 3}, 5), true);
  Tape tape;
  Var loss = sum(rematerialize([&](const Var& h, const Tensor*) { return matmul(h, w); }, x));
  x.mutable_value()[0] = 2.0f;
  CHECK(contains(error_of<std::logic_error>([&] { tape.backward(loss); }),
                 "rematerialize's input 0 of shape [2, 3] was changed in place"));
}

TEST_CASE("unchanged graphs, and changes after backward or before the forward, are unaffected") {
  Var x(test::random_tensor({2, 3}, 6), true), w(test::random_tensor({3, 4}, 7), true);
  w.mutable_value()[0] = 0.5f;  // before any op read it: the op records version 1
  for (int step = 0; step < 3; ++step) {
    Tape tape;
    Var loss = sum(mul(matmul(x, w), matmul(x, w)));
    tape.backward(loss);
    CHECK(w.has_grad());
    Tensor& value = w.mutable_value();  // the optimizer's update, after backward
    for (std::size_t i = 0; i < value.size(); ++i) value[i] -= 0.1f * w.grad()[i];
    w.zero_grad();
  }
  CHECK(w.version() == 4);
}

TEST_CASE("an input that no backward keeps alive needs no check") {
  // y = x + c, whose backward captures x alone: once the caller drops c, nothing can change it.
  auto shift = [](const Var& x, const Var& c) {
    Op op("shift", {x, c});
    Tensor y = x.value();
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += c.value()[i];
    return op.finish(std::move(y), [x](const Tensor& dy, const Tensor&) { accumulate_grad(x, dy); });
  };
  Var w(test::random_tensor({3}, 8), true);
  Tape tape;
  Var loss;
  {
    Var c(test::random_tensor({3}, 9));
    loss = sum(shift(w, c));
    c.mutable_value()[0] = 1.0f;  // changed, then dropped: only the tape's weak reference is left
  }
  tape.backward(loss);
  CHECK(w.grad()[0] == 1.0f);
}
