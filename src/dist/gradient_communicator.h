// GradientCommunicator: what the Reducer drives, the gradient arena and the asynchronous
// allreduce of its buckets (PyTorch DDP's comm hook; the control messages are the
// ProcessGroup's, process_group.h). The MPI implementation runs them on a communication lane
// per rank (src/dist/mpi/lane.h): its own thread drives them while the training thread computes
// the rest of backward (Open MPI does not progress a non-blocking collective unless someone
// calls into MPI), and a thread that waits for one drives them itself. The CUDA communicators
// (src/dist/device_communicators.h) implement it over GPU memory: NCCL on a comm stream, or
// staged through pinned host memory and MPI.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "dist/work.h"

namespace ddp {

/// Work a device communicator has done on the communication lane around an MPI collective of
/// host memory: `ready` waits for the data to exist (not timed), `before` stages it into the
/// host buffer, `after` copies the result back. Each may be empty.
struct LaneHooks {
  std::function<void()> ready, before, after;
};

/// The gradient buckets of every rank, summed (or averaged) in place bucket by bucket, each
/// allreduce started as soon as its bucket is complete and finished when its Work is waited on.
class GradientCommunicator {
 public:
  virtual ~GradientCommunicator() = default;

  /// Starts an in-place allreduce of `count` floats; with `average` the result is divided by
  /// the number of ranks. The buffer must not be touched until wait() returns. Collectives
  /// start in call order. `hooks` (MPI communicator only) run on the communication lane
  /// around it.
  virtual std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average,
                                                const LaneHooks* hooks = nullptr) = 0;

  /// Collective, once: `numel` zero-initialised floats for the gradient buckets, owned by the
  /// communicator until it is destroyed. allreduce_async on ranges of this memory may take a
  /// zero-copy path (MPI: when every rank is on one node, the memory is an MPI shared-memory
  /// window and ranks reduce straight out of each other's buckets). Device communicators
  /// return device memory. shared=false asks for ordinary memory (and so MPI_Allreduce) even
  /// on one node.
  virtual float* gradient_arena(size_t numel, bool shared = true) = 0;

  /// How long a bucket's allreduce may take before it is declared lost (a dead or stalled
  /// peer): waiting for it then throws ddp::Error naming the collective and the time, and the
  /// communicator is broken. Default 600 s.
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout() const = 0;
};

}  // namespace ddp
