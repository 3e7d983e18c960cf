// Rematerialised blocks: see Note [Remat] in core/remat.h.
#include "core/remat.h"

#include "core/kernels.h"
#include "core/op_recording.h"

namespace tapegrad {

Var rematerialize(Block block, const Var& x) {
  Tape* tape = Tape::current();
  if (!tape || !x.requires_grad()) return block(x, nullptr);
  auto out = std::make_shared<Node>();
  std::vector<RecordedInput> inputs{RecordedInput(x)};
  {
    NoGradScope no_grad;
    LeafReads leaves;  // the block's parameters, recorded as the entry's inputs too
    out->value = std::move(block(x, nullptr).node().value);
    for (RecordedInput& leaf : leaves.take()) inputs.push_back(std::move(leaf));
  }
  tape->record("rematerialize", std::move(inputs), out, [block = std::move(block), x](Node& o) {
    Var input(x.value(), /*requires_grad=*/true);
    Tape nested;
    Var y = block(input, &o.value);
    nested.backward(y, o.grad);
    Tensor& dx = *grad_if_needed(x);  // x requires a gradient (checked above)
    kernels::accumulate(dx.data(), input.grad().data(), dx.size());
  }, 0);
  return Var(out);
}

}  // namespace tapegrad
