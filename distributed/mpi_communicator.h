// The MPI communicator (built when CMake finds MPI; TAPEGRAD_MPI): only distributed/communicator.cpp
// includes this, and only this pair includes <mpi.h>.
#pragma once

#include <memory>

#include "distributed/communicator.h"

namespace tapegrad::distributed {

/// Initializes MPI (thread level funneled: OpenMP threads compute, the main thread talks) over
/// MPI_COMM_WORLD; MPI_Finalize runs when the object is destroyed.
std::unique_ptr<Communicator> make_mpi_communicator(int& argc, char**& argv);

}  // namespace tapegrad::distributed
