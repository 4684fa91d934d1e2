// ProcessGroup: the ranks of the job and the control messages between them (metrics, agreement
// flags, broadcasts of bytes, barriers), as PyTorch's ProcessGroup is to its DDP reducer. The
// gradient buckets travel on a GradientCommunicator (gradient_communicator.h) instead.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/work.h"

namespace ddp {

enum class ReduceOp { Sum, Max, Min };

/// The ranks of the job and their collectives on small host-memory data; every call is
/// collective and runs in call order with the group's other collectives.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// This rank's place among the ranks sharing its node (MPI_COMM_TYPE_SHARED).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;

  /// Blocking allreduce of doubles (metrics, agreement flags).
  virtual void allreduce(double* data, size_t count, ReduceOp op) = 0;
  /// Blocking allgather: `count` doubles from every rank into all[rank * count ...], in rank
  /// order, on every rank (on one node through shared memory and one barrier).
  virtual void allgather(const double* mine, size_t count, double* all) = 0;
  /// Starts an in-place allreduce of `count` floats (flags read a step later); the memory must
  /// not be touched until wait() returns.
  virtual std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op) = 0;
  /// Blocking broadcast of raw bytes (host memory) from `root`.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  /// Blocking gather of `bytes` from every rank into all[rank * bytes ...] on `root` (`all` is
  /// not touched elsewhere and may be null there).
  virtual void gather(const void* mine, size_t bytes, void* all, int root) = 0;
  /// Blocking scatter: rank k receives all[k * bytes ...] of `root`'s `all` into `mine`.
  virtual void scatter(const void* all, size_t bytes, void* mine, int root) = 0;
  virtual void barrier() = 0;

  /// How long any collective may take before it is declared lost (a dead or stalled peer):
  /// waiting for it then throws ddp::Error naming the collective and the time, and the group
  /// is broken (later collectives fail; its destructor does not wait for the lost one).
  /// Default 600 s.
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout() const = 0;
};

}  // namespace ddp
