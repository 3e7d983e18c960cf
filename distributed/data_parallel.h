// Data-parallel training helpers over a Communicator: gradients summed in flat
// buckets of several parameters (PyTorch DDP's buckets, Horovod's tensor fusion), in fixed order,
// so that N ranks and one process accumulating N micro-batches do the same float arithmetic; and
// the sharded optimizer state of ZeRO-1 (each rank updates a shard, then the parameters are
// gathered); and the replica check (a hash of every parameter, compared across ranks).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/parameter.h"
#include "core/tape.h"
#include "distributed/communicator.h"
#include "optim/optimizer.h"

namespace tapegrad::distributed {

/// The gradients of the parts of a step (ranks, micro-batches), summed in a fixed order in flat
/// buckets of whole parameters, so that the sum does not depend on how the batch was split.
///
/// The exchange of a bucket can overlap the rest of backward: pass exchange_during_backward() to
/// the backward of this rank's last part (Tape::backward's observer). As each parameter's
/// gradient becomes final it goes into its bucket; a complete bucket's ordered sum starts at once
/// (nonblocking), buckets strictly in their fixed order, so every rank starts the same
/// collectives in the same order; the tape's entries poll them along. Buckets hold parameters in
/// reverse order, the order in which backward finishes them (PyTorch DDP's buckets). The sums are
/// the very same float operations either way (element by element, in rank order).
class GradientBuckets : private BackwardObserver {
 public:
  /// Buckets of whole parameters, from the last parameter back to the first, each closed once
  /// it holds bucket_floats or more. A frozen parameter (no gradient) is refused:
  /// std::invalid_argument naming it (pass trainable(params)).
  explicit GradientBuckets(ParameterList params, std::size_t bucket_floats = std::size_t(1) << 16);

  /// Adds every parameter's current gradient into the buckets (a missing gradient counts as
  /// zeros); the first call after construction or reduce() copies instead of adding.
  void accumulate();
  /// The observer for the backward of this rank's last part: it adds each gradient as
  /// accumulate() does, once final, and starts the sums of complete buckets over comm. reduce()
  /// must follow (also when that backward did not run or threw: it adds what was not added).
  BackwardObserver& exchange_during_backward(Communicator& comm);
  /// buckets <- (sum over ranks in rank order of each rank's buckets) / parts, written into every
  /// parameter's gradient; then the buckets start afresh. parts is the number of gradients summed
  /// over all ranks (ranks x micro-batches). Starts the sums not started during backward, then
  /// waits for all. Returns the seconds spent in the communicator's calls, those made during
  /// backward included: the exchange time visible in the step (without overlap, all of it).
  double reduce(Communicator& comm, std::size_t parts);

  std::size_t bucket_count() const { return buckets_.size(); }  ///< The number of buckets.
  std::size_t floats() const;  ///< The floats in all buckets (every parameter's size, added up).

 private:
  struct Bucket {
    std::size_t first = 0, last = 0;  // parameters [first, last), laid out in that order
    std::vector<float> values;
    std::size_t waiting = 0;               // parameters not added yet during an overlapped backward
    std::unique_ptr<PendingSum> sum;       // started, not yet known to be done
  };
  const std::vector<Var>& watched() const override { return vars_; }
  void gradient_final(std::size_t index) override;
  void entry_done() override;
  void add_gradient(std::size_t parameter);
  void start_ready_buckets();  // in bucket order, up to the first incomplete one

  ParameterList params_;
  std::vector<Var> vars_;                 // params_' Vars, for the tape
  std::vector<Bucket> buckets_;           // the last parameters first
  std::vector<std::size_t> bucket_of_;    // parameter -> bucket
  std::vector<std::size_t> offset_of_;    // parameter -> its first float in its bucket
  std::vector<bool> pending_;             // not yet added during an overlapped backward
  Communicator* comm_ = nullptr;          // set while an overlapped exchange is under way
  std::size_t next_start_ = 0;            // the next bucket whose sum starts
  std::size_t next_done_ = 0;             // the earliest bucket whose sum may not be done
  double comm_seconds_ = 0;               // in the communicator's calls this step
  bool empty_ = true;
};

/// ZeRO-1's shard of `rank` among `ranks` for total elements in flat order: contiguous pieces of
/// ceil(total / ranks) elements in rank order (the last ones shorter, or empty).
optim::FlatRange optimizer_shard(std::size_t total, int rank, int ranks);

/// After a sharded optimizer step (optim::Optimizer::keep_only(optimizer_shard(...))): every rank
/// sends the parameters' elements of its shard, and every rank writes all shards into its
/// parameters (an allgather in rank order), so that the replicas are equal again.
void allgather_parameters(Communicator& comm, ParameterList& params);

/// The whole state of an optimizer whose ranks each keep their optimizer_shard, on every rank
/// (each slot allgathered in rank order): what a checkpoint holds, whatever the number of ranks.
optim::OptimizerState gathered_state(Communicator& comm, const optim::Optimizer& optimizer);

/// FNV-1a 64 of every parameter's value bytes, in order.
std::uint64_t parameters_hash(const ParameterList& params);

/// Compares parameters_hash across ranks; throws std::runtime_error on every rank, naming the
/// ranks and hashes, when they differ (the replicas diverged: a bug or a faulty machine).
void check_same_parameters(Communicator& comm, const ParameterList& params, const std::string& when);

}  // namespace tapegrad::distributed
