// Rematerialised blocks: see Note [Remat] in core/remat.h.
#include "core/remat.h"

#include "core/kernels.h"

namespace tapegrad {

Var rematerialize(Block block, const Var& x) {
  Tape* tape = Tape::current();
  if (!tape || !x.requires_grad()) return block(x, nullptr);
  auto out = std::make_shared<Node>();
  {
    NoGradScope no_grad;
    out->value = std::move(block(x, nullptr).node().value);
  }
  tape->record(out, [block = std::move(block), xn = x.node_ptr()](Node& o) {
    Var input(xn->value, /*requires_grad=*/true);
    Tape nested;
    Var y = block(input, &o.value);
    nested.backward(y, o.grad);
    Tensor& dx = Var(xn).grad_buffer();
    kernels::accumulate(dx.data(), input.grad().data(), dx.size());
  }, 0);
  return Var(out);
}

}  // namespace tapegrad
