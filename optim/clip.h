// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_ (Pascanu et al. 2013).
#pragma once

#include "core/parameter.h"

namespace tapegrad::optim {

/// norm = sqrt(sum over all parameters' gradients of g^2) (accumulated in double; a parameter
/// without a gradient counts as zero and stays without one); when c = max_norm / (norm + 1e-6) < 1,
/// every gradient is scaled by c in place. Returns the norm before clipping. A non-finite norm is
/// returned with the gradients left unchanged (the caller decides to stop or skip the step).
float clip_grad_norm(const ParameterList& params, float max_norm);

}  // namespace tapegrad::optim
