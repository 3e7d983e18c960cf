// The number of threads the kernels use (core/threads.cpp): the OpenMP row loops and split
// matrix products; BLAS itself runs on one thread, so only one parallel runtime is ever active.
#pragma once

namespace tapegrad {

/// Sets the kernels' thread count. n = 0 means OMP_NUM_THREADS when it is set, as in PyTorch,
/// and otherwise every core the process may use.
void set_num_threads(int n);
/// The number of threads the kernels use.
int num_threads();

}  // namespace tapegrad
