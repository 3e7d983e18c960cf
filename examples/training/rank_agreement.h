// How the ranks of a data-parallel run fail together: an error raised on every rank alike is
// "agreed" (only rank 0 prints it and MPI ends normally); rank 0's own failures reach every rank.
#pragma once

#include <atomic>
#include <stdexcept>
#include <string>

#include "cli/program.h"
#include "distributed/communicator.h"

namespace tapegrad::examples {

/// Marks the error about to be thrown as raised on every rank alike (failure_is_agreed(), trainer.h).
void mark_failure_agreed();

/// Runs body; an exception it throws is marked agreed (every rank runs the same body and fails alike).
template <class F>
decltype(auto) agreed(F&& body) {
  try {
    return body();
  } catch (...) {
    mark_failure_agreed();
    throw;
  }
}

/// Runs body on rank 0 only; its failure is sent to every rank, which all throw it (agreed).
template <class F>
void on_leader(distributed::Communicator& comm, F&& body) {
  if (comm.size() == 1) return body();
  int status = 0;  // 0: done; 2: a UsageError; 1: another error
  std::string message;
  if (comm.rank() == 0) {
    try {
      body();
    } catch (const UsageError& e) {
      status = 2, message = e.what();
    } catch (const std::exception& e) {
      status = 1, message = e.what();
    }
  }
  distributed::broadcast_values(comm, std::span(&status, 1));
  if (status == 0) return;
  distributed::broadcast_string(comm, message);
  mark_failure_agreed();
  if (status == 2) throw UsageError(message);
  throw std::runtime_error(message);
}

}  // namespace tapegrad::examples
