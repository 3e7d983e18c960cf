// CPU affinity for the decoding loop and the HTTP workers (sched_getaffinity, pthread_setaffinity_np),
// and the workers' scheduling class.
#include "serve/cpus.h"

#include <pthread.h>
#include <sched.h>

namespace tapegrad::serve {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

CpuSplit split_cpus(const std::vector<int>& allowed, std::size_t decoding_threads) {
  if (decoding_threads == 0 || allowed.size() <= decoding_threads) return {};
  const auto middle = allowed.begin() + std::ptrdiff_t(decoding_threads);
  return {.decoding = {allowed.begin(), middle}, .others = {middle, allowed.end()}};
}

bool run_on(const std::vector<int>& cpus) {
  if (cpus.empty()) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

// Under normal scheduling each of the 64 streams' 100 wake-ups a second could land on the decoding
// thread's core and preempt it (measured: docs/benchmarks.md, "Measurements behind choices in the
// code"). Unlike a higher nice value, SCHED_BATCH leaves the workers' share of the cores as it was.
void settle_worker(const std::vector<int>& cpus) {
  static thread_local const bool done = [&] {
    const sched_param none{};
    const bool placed = run_on(cpus);
    return pthread_setschedparam(pthread_self(), SCHED_BATCH, &none) == 0 && placed;
  }();
  (void)done;
}

}  // namespace tapegrad::serve
