// The communicator of data-parallel training: rank, size, a sum of float buffers
// across ranks in fixed rank order, broadcast, allgather and barrier. One process always; MPI
// when the build found it (distributed/mpi_communicator.cpp). core/, nn/ and optim/ never include this.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tapegrad::distributed {

/// An ordered sum in progress (Communicator::start_ordered_sum). Its buffer must stay alive and
/// untouched until it is done, and every sum started must be completed (MPI has no cancelling a
/// collective).
class PendingSum {
 public:
  virtual ~PendingSum() = default;
  /// Advances the sum without blocking; true once the buffer holds the result.
  virtual bool test() = 0;
  /// Blocks until the buffer holds the result.
  virtual void wait() = 0;
};

/// What data-parallel training needs of a transport: this process's rank among size ranks and
/// the collectives, each with a result that does not depend on the transport.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  ///< This process's rank, 0 to size() - 1 (0 leads).
  virtual int size() const = 0;  ///< The number of ranks.
  /// What carries the messages, for logs: "one process", "MPI (Open MPI v4.1.4, ...)".
  virtual std::string description() const = 0;

  /// buffer[i] <- ((b_0[i] + b_1[i]) + b_2[i]) + ... over ranks 0, 1, ..., size-1 in that order,
  /// identical on every rank whatever the transport: the reduction is an exchange of shards and a
  /// local sum in rank order, never the MPI library's own reduction tree. Same length everywhere.
  void ordered_sum(std::span<float> buffer) { start_ordered_sum(buffer)->wait(); }
  /// The same sum, started without waiting (nonblocking MPI), so that it runs under computation;
  /// every rank starts its sums (and other collectives) in the same order.
  virtual std::unique_ptr<PendingSum> start_ordered_sum(std::span<float> buffer) = 0;
  /// Root's bytes into every rank's buffer (same length everywhere).
  virtual void broadcast(std::span<std::byte> bytes, int root) = 0;
  /// Every rank's `mine` (the same length everywhere), concatenated in rank order.
  virtual std::vector<std::byte> allgather(std::span<const std::byte> mine) = 0;
  /// Returns on every rank once every rank has called it.
  virtual void barrier() = 0;
  /// Ends every rank at once with this status (after an error on one rank only: the others
  /// would otherwise wait in their next collective).
  [[noreturn]] virtual void abort(int status) = 0;
};

/// The communicator of one process: size 1; sums and broadcast leave the data as it is.
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }  ///< 0
  int size() const override { return 1; }  ///< 1
  std::string description() const override { return "one process"; }
  std::unique_ptr<PendingSum> start_ordered_sum(std::span<float>) override;  ///< Done at once.
  void broadcast(std::span<std::byte>, int) override {}
  std::vector<std::byte> allgather(std::span<const std::byte> mine) override { return {mine.begin(), mine.end()}; }
  void barrier() override {}  ///< Returns at once.
  [[noreturn]] void abort(int status) override;
};

/// The number of processes a launcher says it started, from the first of OMPI_COMM_WORLD_SIZE
/// (mpirun), PMI_SIZE (MPICH, Slurm's PMI) and SLURM_NTASKS that is set; nullopt when none is.
struct LaunchSize {
  std::size_t size;      ///< the number of processes
  std::string variable;  ///< the variable that said so, e.g. "OMPI_COMM_WORLD_SIZE=2"
};
/// The launcher's process count (LaunchSize), or nullopt when no launcher variable is set.
std::optional<LaunchSize> launch_size_from_environment();

/// How long a rank waits in one collective before it calls the roll of the other ranks, names
/// those that do not answer (a host or link down) and ends the job: TAPEGRAD_PEER_TIMEOUT seconds,
/// 600 when unset, 0 for no limit. Raise it above the longest work rank 0 does alone (writing a
/// checkpoint, validating) while the others wait. Throws std::runtime_error naming a value that is
/// not a number of seconds.
std::chrono::milliseconds peer_timeout_from_environment();

/// Whether this build has the MPI communicator (CMake option TAPEGRAD_MPI).
bool built_with_mpi();

/// The communicator of this process: MPI when the build has it and a launcher started the process
/// (launch_size_from_environment() or PMIX_RANK), one process otherwise. Throws std::runtime_error
/// saying why when a launcher reports N > 1 processes that this process cannot join: a build
/// without MPI, or MPI that sees a different world (e.g. srun without --mpi=pmix).
/// The MPI library is finalized when the returned object is destroyed.
std::unique_ptr<Communicator> make_communicator(int& argc, char**& argv);

/// The check behind make_communicator's refusal: nothing when the launch and the world agree,
/// else the message. world_size is nullopt in a build without MPI.
std::optional<std::string> launch_mismatch(const std::optional<LaunchSize>& launch, std::optional<int> world_size);

// Typed conveniences over the byte calls.

/// Root's values (trivially copyable) into every rank's span of the same length.
template <class T, std::size_t N>
void broadcast_values(Communicator& comm, std::span<T, N> values, int root = 0) {
  comm.broadcast(std::as_writable_bytes(values), root);
}
/// Root's string into every rank's, resized everywhere first.
void broadcast_string(Communicator& comm, std::string& text, int root = 0);
/// Root's floats into every rank's vector, resized everywhere first.
void broadcast_floats(Communicator& comm, std::vector<float>& values, int root = 0);

/// Every rank's value, in rank order.
template <class T>
std::vector<T> allgather_value(Communicator& comm, const T& mine) {
  std::vector<std::byte> all = comm.allgather(std::as_bytes(std::span(&mine, 1)));
  std::vector<T> out(all.size() / sizeof(T));
  std::copy(all.begin(), all.end(), reinterpret_cast<std::byte*>(out.data()));
  return out;
}

}  // namespace tapegrad::distributed
