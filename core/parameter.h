// A named trainable tensor: what modules enumerate (nn), optimizers update (optim) and
// checkpoints store, under the names of SPEC section 5.
#pragma once

#include <string>
#include <vector>

#include "core/tape.h"

namespace tapegrad {

struct NamedParameter {
  std::string name;  // e.g. "blocks.0.attn.wq.weight"
  Var var;           // a leaf with requires_grad; shared with the module that owns it
};

using ParameterList = std::vector<NamedParameter>;

}  // namespace tapegrad
