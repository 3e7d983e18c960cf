// The kernel thread setting. BLAS runs single-threaded; large products are split across OpenMP
// threads by the kernels themselves (core/kernels/matmul.cpp).
#include <cblas.h>
#include <omp.h>

#include "core/kernels.h"

namespace tapegrad {

static int g_threads = 0;

void set_num_threads(int n) {
  openblas_set_num_threads(1);
  g_threads = n > 0 ? n : omp_get_max_threads();  // OMP_NUM_THREADS, or every core we may use
}

int num_threads() {
  if (g_threads == 0) set_num_threads(0);
  return g_threads;
}

}  // namespace tapegrad
