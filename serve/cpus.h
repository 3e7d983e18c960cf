// Which CPUs the decoding loop and the HTTP threads run on. On a machine with more CPUs than the
// decoding's kernel threads, the decoding gets cores of its own: otherwise the scheduler places
// the streams' workers, which wake a hundred times a second each, on the decoding thread's core,
// where they take turns with it (docs/benchmarks.md, "Measurements behind choices in the code").
#pragma once

#include <cstddef>
#include <vector>

namespace tapegrad::serve {

/// A split of the CPUs between the decoding loop and everything else.
struct CpuSplit {
  std::vector<int> decoding;  ///< the decoding loop's thread and the kernel threads it starts
  std::vector<int> others;    ///< the HTTP workers
};

/// The CPUs the calling thread may run on (sched_getaffinity), in increasing order.
std::vector<int> allowed_cpus();

/// The first `decoding_threads` of `allowed` for the decoding and the rest for the others, when
/// at least one is left over; otherwise both empty (everything shares every CPU).
CpuSplit split_cpus(const std::vector<int>& allowed, std::size_t decoding_threads);

/// Keeps the calling thread (and the threads it starts from now on) on `cpus`; nothing if empty.
/// Returns false if the system refused (the thread then runs where it did).
bool run_on(const std::vector<int>& cpus);

/// Settles the calling HTTP worker, once per thread: on `cpus` (none: where it was), and under
/// SCHED_BATCH. Such a thread, when it wakes, takes an idle core at once but never preempts the
/// decoding thread on a busy one: it waits for the scheduler's next tick there instead.
void settle_worker(const std::vector<int>& cpus);

}  // namespace tapegrad::serve
