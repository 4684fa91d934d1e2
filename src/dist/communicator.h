// Communicator: the collectives data parallelism needs. The MPI implementation runs them on a
// communication lane per rank (src/dist/mpi/lane.h): its own thread drives them while the training
// thread computes the rest of backward (Open MPI does not progress a non-blocking collective
// unless someone calls into MPI), and a thread that waits for one drives them itself. The CUDA communicators (src/dist/device_communicators.h)
// implement the same interface over GPU memory: NCCL on a comm stream, or staged through
// pinned host memory and MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/clock.h"

namespace ddp {

enum class ReduceOp { Sum, Max, Min };

/// Handle of an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  /// Makes the result visible to what the caller does next and rethrows the collective's error
  /// (a ddp::Error). On host memory the collective has completed when it returns; on device
  /// memory with NCCL, work queued afterwards on the compute stream waits for it and the host
  /// returns at once. Gives up after the communicator's timeout with an error naming it.
  virtual void wait() = 0;
  /// Blocks the host until the collective has completed (same timeout), after which
  /// start_time()/end_time() are valid.
  virtual void synchronize() { wait(); }
  /// Seconds on the seconds_now() clock when the collective began and ended executing on the
  /// communication lane.
  virtual double start_time() const = 0;
  virtual double end_time() const = 0;
};

/// Work a device communicator has done on the communication lane around an MPI collective of
/// host memory: `ready` waits for the data to exist (not timed), `before` stages it into the
/// host buffer, `after` copies the result back. Each may be empty.
struct LaneHooks {
  std::function<void()> ready, before, after;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// This rank's place among the ranks sharing its node (MPI_COMM_TYPE_SHARED).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;

  /// Starts an in-place allreduce of `count` floats; with `average` the result is divided by
  /// size(). The buffer must not be touched until wait() returns. Collectives start in call
  /// order. `hooks` (MPI communicator only) run on the communication lane around it.
  virtual std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average,
                                                const LaneHooks* hooks = nullptr) = 0;

  /// Collective, once: `numel` zero-initialised floats for the gradient buckets, owned by the
  /// communicator until it is destroyed. allreduce_async on ranges of this memory may take a
  /// zero-copy path (MPI: when every rank is on one node, the memory is an MPI shared-memory
  /// window and ranks reduce straight out of each other's buckets). Device communicators
  /// return device memory. shared=false asks for ordinary memory (and so MPI_Allreduce) even
  /// on one node.
  virtual float* gradient_arena(size_t numel, bool shared = true) = 0;

  /// Blocking allreduce of doubles (metrics, agreement flags).
  virtual void allreduce(double* data, size_t count, ReduceOp op) = 0;
  /// Blocking broadcast of raw bytes (host memory) from `root`.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  /// How long any collective may take before it is declared lost (a dead or stalled peer):
  /// waiting for it then throws ddp::Error naming the collective and the time, and the
  /// communicator is broken (later collectives fail; its destructor does not wait for the
  /// lost one). Default 600 s.
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout() const = 0;
};

}  // namespace ddp
