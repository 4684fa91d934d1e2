// Communicator: the collectives data parallelism needs. The MPI implementation runs every MPI
// call on one communication thread per rank, so a gradient allreduce progresses while the
// training thread computes the rest of backward (Open MPI does not progress a non-blocking
// collective unless someone calls into MPI). The NCCL implementation arrives with CUDA.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ddp {

enum class ReduceOp { Sum, Max, Min };

/// Handle of an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  /// Blocks until the collective is complete; rethrows its error (a ddp::Error) if it failed.
  virtual void wait() = 0;
  /// Seconds on the steady clock (seconds_now()) when the collective began and ended executing on
  /// the communication lane; valid after wait().
  virtual double start_time() const = 0;
  virtual double end_time() const = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// Starts an in-place allreduce of `count` floats; with `average` the result is divided by
  /// size(). The buffer must not be touched until wait() returns. Collectives start in call order.
  virtual std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average) = 0;

  /// Collective, once: `numel` zero-initialised floats for the gradient buckets, owned by the
  /// communicator until it is destroyed. allreduce_async on ranges of this memory may take a
  /// zero-copy path (MPI: when every rank is on one node, the memory is an MPI shared-memory
  /// window and ranks reduce straight out of each other's buckets).
  /// shared=false asks for ordinary memory (and so MPI_Allreduce) even on one node.
  virtual float* gradient_arena(size_t numel, bool shared = true) = 0;

  /// Blocking allreduce of doubles (metrics, agreement flags).
  virtual void allreduce(double* data, size_t count, ReduceOp op) = 0;
  /// Blocking broadcast of raw bytes from `root`.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
};

/// A communicator over a duplicate of `comm` (MPI must be initialised with at least
/// MPI_THREAD_SERIALIZED). Must be destroyed before MPI_Finalize.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

/// Broadcasts a string from `root` (size, then bytes); returns root's string on every rank.
std::string broadcast_string(Communicator& comm, const std::string& s, int root);

/// Monotonic clock in seconds, shared by timings on all threads.
double seconds_now();

/// CPU time consumed by the calling thread, in seconds (what it really computed, as opposed
/// to the wall time during which it may have waited for a core).
double thread_cpu_seconds();

}  // namespace ddp
