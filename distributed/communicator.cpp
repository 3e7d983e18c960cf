// The one-process communicator, the launcher checks, and the choice between one process and MPI.
#include "distributed/communicator.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#if TAPEGRAD_HAVE_MPI
#include "distributed/mpi_communicator.h"
#endif

namespace tapegrad::distributed {

void SingleProcess::abort(int status) { std::_Exit(status); }

std::unique_ptr<PendingSum> SingleProcess::start_ordered_sum(std::span<float>) {
  struct Done final : PendingSum {
    bool test() override { return true; }
    void wait() override {}
  };
  return std::make_unique<Done>();
}

std::optional<LaunchSize> launch_size_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    const char* value = std::getenv(name);
    if (!value) continue;
    std::size_t size = 0;
    const std::string_view text(value);
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), size);
    if (ec != std::errc() || end != text.data() + text.size() || size == 0)
      throw std::runtime_error(fmt::format("the environment variable {}={} is not a process count", name, value));
    return LaunchSize{size, fmt::format("{}={}", name, value)};
  }
  return std::nullopt;
}

std::chrono::milliseconds peer_timeout_from_environment() {
  const char* value = std::getenv("TAPEGRAD_PEER_TIMEOUT");
  if (!value) return std::chrono::minutes(10);
  const std::string text(value);
  double seconds = -1;
  std::size_t end = 0;
  try {
    seconds = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  if (end == 0 || end != text.size() || !(seconds >= 0) || seconds > 1e7)
    throw std::runtime_error(fmt::format(
        "the environment variable TAPEGRAD_PEER_TIMEOUT={} is not a number of seconds (0 waits without limit)", text));
  // Rounded up: a positive timeout under a millisecond must not become 0, which waits without limit.
  return std::chrono::milliseconds(std::int64_t(std::ceil(seconds * 1e3)));
}

bool built_with_mpi() { return TAPEGRAD_HAVE_MPI != 0; }

std::optional<std::string> launch_mismatch(const std::optional<LaunchSize>& launch, std::optional<int> world_size) {
  if (!launch || launch->size <= 1) return std::nullopt;
  if (!world_size)
    return fmt::format(
        "this build has no MPI (CMake found none, or TAPEGRAD_MPI=OFF), but it was started as one of {} processes "
        "({}): each would train alone and write the same files; rebuild with MPI (scripts/deps.sh installs Open MPI) "
        "or start one process",
        launch->size, launch->variable);
  if (std::size_t(*world_size) != launch->size)
    return fmt::format(
        "the launcher started {} processes ({}), but MPI sees {}: the processes cannot reach each other (under Slurm, "
        "use srun --mpi=pmix; check that mpirun and this program use the same MPI)",
        launch->size, launch->variable, *world_size);
  return std::nullopt;
}

std::unique_ptr<Communicator> make_communicator([[maybe_unused]] int& argc, [[maybe_unused]] char**& argv) {
  const std::optional<LaunchSize> launch = launch_size_from_environment();
#if TAPEGRAD_HAVE_MPI
  // MPI only under a launcher: a plain start stays a plain process (no MPI singleton start-up).
  if (launch || std::getenv("PMIX_RANK")) {
    std::unique_ptr<Communicator> comm = make_mpi_communicator(argc, argv);
    if (auto why = launch_mismatch(launch, comm->size())) {
      // Every rank of this world (often a world of one) agrees on this, so MPI ends normally.
      comm.reset();
      throw std::runtime_error(*why);
    }
    return comm;
  }
#endif
  if (auto why = launch_mismatch(launch, built_with_mpi() ? std::optional<int>(1) : std::nullopt))
    throw std::runtime_error(*why);
  return std::make_unique<SingleProcess>();
}

void broadcast_string(Communicator& comm, std::string& text, int root) {
  std::uint64_t size = text.size();
  broadcast_values(comm, std::span(&size, 1), root);
  text.resize(size);
  comm.broadcast(std::as_writable_bytes(std::span(text)), root);
}

void broadcast_floats(Communicator& comm, std::vector<float>& values, int root) {
  std::uint64_t size = values.size();
  broadcast_values(comm, std::span(&size, 1), root);
  values.resize(size);
  broadcast_values(comm, std::span(values), root);
}

}  // namespace tapegrad::distributed
