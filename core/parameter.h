// A named trainable tensor: what modules enumerate (nn), optimizers update (optim) and
// checkpoints store, under dotted names such as "blocks.0.attn.wq.weight".
#pragma once

#include <string>
#include <vector>

#include "core/tape.h"

namespace tapegrad {

/// A parameter and its dotted name.
struct NamedParameter {
  std::string name;  ///< e.g. "blocks.0.attn.wq.weight"
  Var var;           ///< a leaf with requires_grad; shared with the module that owns it
};

/// Parameters in a fixed order (a module's params(), an optimizer's).
using ParameterList = std::vector<NamedParameter>;

}  // namespace tapegrad
