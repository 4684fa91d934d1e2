// Work: the handle of an asynchronous collective, what both the process group (a stop flag)
// and the gradient communicators (a bucket) hand back, so the caller decides when to wait.
#pragma once

namespace ddp {

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
  /// When what the collective waits for was there (a bucket: its gradients, on the compute
  /// stream on a GPU); start_time() where the lane begins a collective only then.
  virtual double ready_time() const { return start_time(); }
};

}  // namespace ddp
