// The CPU communicator over MPI (mpi_communicator.cpp): collectives on the rank's communication
// lane (lane.h); on one node, gradient buckets reduced in place in a shared-memory window.
#pragma once

#include <mpi.h>

#include <memory>

#include "dist/communicator.h"

namespace ddp {

/// A communicator over a duplicate of `comm` (MPI must be initialised with at least
/// MPI_THREAD_SERIALIZED). Must be destroyed before MPI_Finalize.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

}  // namespace ddp
