// The CPU communicator over MPI (mpi_communicator.cpp): one object is both the job's process
// group and the gradient communicator of host memory, with their collectives on the rank's one
// communication lane (lane.h); on one node, gradient buckets are reduced in place in a
// shared-memory window.
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/flight_recorder.h"
#include "comm/gradient_communicator.h"
#include "comm/process_group.h"

namespace ddp {

/// Control messages and gradient buckets over the same ranks, run in the order they are called
/// on one lane (a stop flag travels behind the step's buckets). The timeout is the lane's.
class MpiCommunicator : public ProcessGroup, public HostGradientCommunicator {
 public:
  using HostGradientCommunicator::allreduce_async;
  using ProcessGroup::allreduce_async;
  void set_timeout(double seconds) override = 0;
  double timeout() const override = 0;
  /// Records every collective issued from now on, control and gradient (null: none).
  virtual void set_flight_recorder(std::shared_ptr<FlightRecorder> recorder) = 0;
  /// Collective: another communicator over the same ranks and nodes, with its own lane and
  /// gradient arena (a wire measured before the job's is chosen: comm/link_probe.h). Call it
  /// with no collective of this one in flight.
  virtual std::unique_ptr<MpiCommunicator> duplicate() = 0;
};

/// A communicator over a duplicate of `comm` (MPI must be initialised with at least
/// MPI_THREAD_SERIALIZED). Must be destroyed before MPI_Finalize. Its nodes are the ranks that
/// share memory; with ranks_per_node > 0, consecutive blocks of that many ranks instead (tests
/// that stand in for several nodes on one machine).
std::unique_ptr<MpiCommunicator> make_mpi_communicator(MPI_Comm comm, int ranks_per_node = 0);

}  // namespace ddp
