// The kernels' thread count (core/threads.cpp). OMP_NUM_THREADS itself is checked through a
// program that starts with it (tests/examples/test_programs.cpp).
#include <doctest/doctest.h>
#include <omp.h>

#include <cstdlib>
#include <string>

#include "core/kernels.h"

using namespace tapegrad;

TEST_CASE("set_num_threads(0) is OMP_NUM_THREADS or every core, on every call; n > 0 is taken as is") {
  const int saved = num_threads();
  const char* env = std::getenv("OMP_NUM_THREADS");
  const int expected = env != nullptr && *env != '\0' ? std::stoi(env) : omp_get_num_procs();
  set_num_threads(0);
  CHECK(num_threads() == expected);
  set_num_threads(5);
  CHECK(num_threads() == 5);
  set_num_threads(0);  // after OpenBLAS has set OpenMP's own count to 1
  CHECK(num_threads() == expected);
  set_num_threads(saved);
}
