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
  /// A leaf shared with the module that owns it; requires_grad unless frozen (Module::freeze):
  /// a frozen parameter gets no gradient and is no optimizer's, clipping's or all-reduce's.
  Var var;
};

/// Parameters in a fixed order (a module's params(), an optimizer's).
using ParameterList = std::vector<NamedParameter>;

/// The parameters that require a gradient (not frozen), in their order: what an optimizer, the
/// gradient clipping and the data-parallel gradient exchange take.
inline ParameterList trainable(const ParameterList& params) {
  ParameterList out;
  for (const NamedParameter& p : params)
    if (p.var.requires_grad()) out.push_back(p);
  return out;
}

}  // namespace tapegrad
