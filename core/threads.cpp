// The kernels' thread count (core/threads.h). BLAS runs single-threaded; large products are
// split across OpenMP threads by the kernels themselves (core/kernels/matmul.cpp).
#include <cblas.h>
#include <omp.h>

#include "core/threads.h"

namespace tapegrad {

static int g_threads = 0;

// OpenMP's count as the program started (OMP_NUM_THREADS, else every core it may use), read once:
// OpenBLAS's OpenMP build sets OpenMP's count to 1 in openblas_set_num_threads(1).
static int openmp_default_threads() {
  static const int n = omp_get_max_threads();
  return n;
}

void set_num_threads(int n) {
  const int all = openmp_default_threads();
  openblas_set_num_threads(1);
  g_threads = n > 0 ? n : all;
}

int num_threads() {
  if (g_threads == 0) set_num_threads(0);
  return g_threads;
}

}  // namespace tapegrad
