// Data-parallel training helpers over a Communicator: gradients summed in flat
// buckets of several parameters (PyTorch DDP's buckets, Horovod's tensor fusion), in fixed order,
// so that N ranks and one process accumulating N micro-batches do the same float arithmetic; and
// the replica check (a hash of every parameter, compared across ranks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/parameter.h"
#include "distributed/communicator.h"

namespace tapegrad::distributed {

/// The gradients of the parts of a step (ranks, micro-batches), summed in a fixed order in flat
/// buckets of whole parameters, so that the sum does not depend on how the batch was split.
class GradientBuckets {
 public:
  /// Whole parameters in parameter order, a bucket closed once it holds bucket_floats or more.
  explicit GradientBuckets(ParameterList params, std::size_t bucket_floats = std::size_t(1) << 20);

  /// Adds every parameter's current gradient into the buckets (a missing gradient counts as
  /// zeros); the first call after construction or reduce() copies instead of adding.
  void accumulate();
  /// buckets <- (sum over ranks in rank order of each rank's buckets) / parts, written into every
  /// parameter's gradient; then the buckets start afresh. parts is the number of gradients summed
  /// over all ranks (ranks x micro-batches). Returns the seconds spent in comm.ordered_sum.
  double reduce(Communicator& comm, std::size_t parts);

  std::size_t bucket_count() const { return buckets_.size(); }  ///< The number of buckets.
  std::size_t floats() const;  ///< The floats in all buckets (every parameter's size, added up).

 private:
  struct Bucket {
    std::size_t first = 0, last = 0;  // parameters [first, last)
    std::vector<float> values;
  };
  ParameterList params_;
  std::vector<Bucket> buckets_;
  bool empty_ = true;
};

/// FNV-1a 64 of every parameter's value bytes, in order.
std::uint64_t parameters_hash(const ParameterList& params);

/// Compares parameters_hash across ranks; throws std::runtime_error on every rank, naming the
/// ranks and hashes, when they differ (the replicas diverged: a bug or a faulty machine).
void check_same_parameters(Communicator& comm, const ParameterList& params, const std::string& when);

}  // namespace tapegrad::distributed
