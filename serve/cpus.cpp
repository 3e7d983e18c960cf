// CPU affinity for the decoding loop and the HTTP workers (sched_getaffinity, pthread_setaffinity_np).
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

}  // namespace tapegrad::serve
