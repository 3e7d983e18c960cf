// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_ (Pascanu et al. 2013),
// alone or folded into the optimizer's update.
#pragma once

#include "core/parameter.h"
#include "optim/optimizer.h"

namespace tapegrad::optim {

/// norm = sqrt(sum over all parameters' gradients of g^2) (accumulated in double; a parameter
/// without a gradient counts as zero and stays without one); when c = max_norm / (norm + 1e-6) < 1,
/// every gradient is scaled by c in place. Returns the norm before clipping. A non-finite norm is
/// returned with the gradients left unchanged (the caller decides to stop or skip the step).
float clip_grad_norm(const ParameterList& params, float max_norm);

/// clip_grad_norm(optimizer.params(), max_norm) then optimizer.step(), the parameters and state
/// bit for bit the same, with the scaling done by the update as it reads each gradient
/// (Optimizer::step_scaled): one pass over the gradients fewer. Returns the norm; a non-finite
/// norm is returned without a step (the caller decides to stop or skip it). The gradients are
/// left unscaled by AdamW: call zero_grad next.
float clip_grad_norm_and_step(Optimizer& optimizer, float max_norm);

}  // namespace tapegrad::optim
