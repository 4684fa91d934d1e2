// Gradient bucketing and the Reducer, with PyTorch DDP's semantics. The bucket plan is a pure
// function of the parameter sizes (identical on every rank); the Reducer counts gradients as
// they become ready during backward and starts each bucket's allreduce as soon as it is full
// and every lower-numbered bucket has started, so communication overlaps the rest of backward.
// A sharded optimizer's update fused into the reduce-scatters (fuse) also waits for backward to
// stop reading the bucket's parameters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/gradient_communicator.h"

namespace ddp {

struct BucketPlan {
  struct Bucket {
    std::vector<size_t> params;  ///< parameter indices, in the order their gradients become ready
    size_t offset = 0;           ///< first element in the flat gradient arena
    size_t numel = 0;
  };
  std::vector<Bucket> buckets;
  std::vector<size_t> param_bucket;  ///< locator: parameter index -> bucket
  std::vector<size_t> param_offset;  ///< locator: parameter index -> offset in the flat arena
  size_t total_numel = 0;
};

/// Assigns parameters (given in registration order by element count) to buckets in reverse
/// registration order, the order backward produces their gradients. The first bucket closes
/// once it holds >= first_bucket_bytes, every later one at >= bucket_bytes; a parameter is
/// never split, so one larger than the cap gets a bucket of its own. Buckets are laid out one
/// after another in a flat arena, parameters inside a bucket in ready order, each starting at a
/// multiple of `align` floats (4 on GPUs: 16-byte vector access; the gaps stay zero).
BucketPlan compute_bucket_plan(const std::vector<size_t>& param_numel, size_t first_bucket_bytes,
                               size_t bucket_bytes, size_t align = 1);

/// One line per bucket ("bucket 0: 123 floats: layers.2.bias layers.2.weight"), for logs and
/// for comparing plans across ranks.
std::string describe_plan(const BucketPlan& plan, const std::vector<std::string>& param_names);

/// When backward ran, for the overlap statistics: wall-clock bounds (seconds_now()) and the
/// CPU time the training thread got in between (thread_cpu_seconds(); on a GPU, where backward
/// does not compete with communication for a core, the wall time).
struct BackwardWindow {
  double begin = 0.0;
  double end = 0.0;
  double cpu_seconds = 0.0;
};

/// Where the communication time of one synchronised step went, for the overlap report.
struct ReducerStepStats {
  double comm_seconds = 0.0;  ///< sum over buckets of allreduce execution time
  /// The part of comm_seconds during which backward was really computing: allreduce time inside
  /// the backward window, less the time the training thread was off its core in that window
  /// (communication that ran on the same core as backward took turns with it; it hid nothing).
  double hidden_seconds = 0.0;
};

/// The statistics of one step from its collectives, which must have completed
/// (Work::synchronize, or wait on host memory).
ReducerStepStats overlap_stats(const std::vector<std::shared_ptr<Work>>& works,
                               const BackwardWindow& backward);

/// How long a step waited for its buckets once backward had made the last of them ready: the
/// latest end of `works` less the ready time (Work::ready_time) of the last of them, the one
/// backward readied last (buckets are launched in the order they are readied); 0 without
/// buckets.
/// What a rank waits for its peers after its own backward: a GPU's device waits there while its
/// host only queues the wait. The collectives must have completed, as for overlap_stats.
double bucket_wait(const std::vector<std::shared_ptr<Work>>& works);

class Reducer {
 public:
  /// grad_arena holds plan.total_numel floats; bucket b is [offset, offset + numel), allreduced.
  Reducer(BucketPlan plan, std::vector<std::string> param_names, float* grad_arena,
          GradientCommunicator& comm);
  /// A sharded optimizer's: each bucket is reduce-scattered instead of allreduced; after
  /// finalize, only this rank's part of it (shard_plan.h) holds the sum.
  static Reducer sharded(BucketPlan plan, std::vector<std::string> param_names, float* grad_arena,
                         ShardedCommunicator& comm);

  /// The sharded optimizer's update fused with the reduce-scatters (distributed.
  /// overlap_optimizer): each bucket's part of the sum goes to `consume`
  /// (HostGradientCommunicator::reduce_scatter_into_async on `comm`, the one the sharded
  /// Reducer was made with), which updates those parameters during
  /// backward. `layer[p]` is parameter p's layer: backward reads a layer's parameter values
  /// until it starts on a layer below, so a complete bucket launches only once a parameter of a
  /// layer below all of its own is marked ready (or at finalize). Every rank's collective then
  /// starts after every rank has stopped reading those values. Before prepare_for_backward.
  void fuse(HostGradientCommunicator& comm, HostGradientCommunicator::PartConsumer consume,
            std::vector<size_t> layer);

  /// Starts a backward pass. With sync=false (a no_sync micro-batch) gradients only
  /// accumulate locally and mark_ready/finalize communicate nothing.
  void prepare_for_backward(bool sync);

  /// The gradient of parameter `param` is final for this backward: counts it and launches
  /// every bucket that is now complete, strictly in index order. Throws if marked twice.
  void mark_ready(size_t param);

  /// Makes every bucket's result visible to what follows and returns the seconds the host
  /// spent waiting. Afterwards the arena holds the gradients summed over ranks (on GPUs with
  /// NCCL: work queued next on the compute stream sees them; the host does not wait). To
  /// average (DDP's semantics) the caller pre-scales by 1/size(): the Trainer folds it into the
  /// loss gradient's scale, which costs nothing, where dividing every bucket would be one more
  /// pass over all gradients. Must run before the optimizer reads gradients. Throws naming
  /// any parameter whose gradient was never marked ready, and the bucket whose collective
  /// failed or timed out.
  double finalize();

  /// The collectives of the last synchronised backward, in bucket order (kept alive by the
  /// caller's copy until their statistics are read).
  const std::vector<std::shared_ptr<Work>>& works() const { return work_; }

  /// Blocks until every collective of `works` has completed, naming the bucket that failed or
  /// timed out (`step` is only used in the message).
  void synchronize(const std::vector<std::shared_ptr<Work>>& works, int64_t step) const;

  /// Stamps each bucket's collective with its index in `recorder` (null: none) while it is
  /// launched; the communicators record it.
  void set_flight_recorder(FlightRecorder* recorder) { recorder_ = recorder; }

  const BucketPlan& plan() const { return plan_; }
  /// Buckets launched so far in this backward (tests use it to observe launch order).
  size_t launched() const { return next_to_launch_; }

 private:
  void launch_ready_buckets();
  bool released(size_t bucket) const;
  std::string describe_bucket(size_t b) const;
  const char* collective() const { return sharded_ ? "reduce-scatter" : "allreduce"; }

  BucketPlan plan_;
  std::vector<std::string> names_;
  float* arena_;
  GradientCommunicator* comm_;
  ShardedCommunicator* sharded_ = nullptr;     // reduce-scatters (sharded())
  HostGradientCommunicator* fused_ = nullptr;  // reduce-scatters into consume_ (fuse())
  bool sync_ = true;
  std::vector<size_t> pending_;  // per bucket: gradients not yet ready
  std::vector<char> marked_;     // per parameter: marked in this backward
  std::vector<std::shared_ptr<Work>> work_;
  size_t next_to_launch_ = 0;
  // fuse(): the consumer, each bucket's lowest layer, and the lowest layer marked ready in
  // this backward (SIZE_MAX before the first; 0 at finalize releases every bucket).
  HostGradientCommunicator::PartConsumer consume_;
  std::vector<size_t> layer_, lowest_layer_;
  size_t reached_ = SIZE_MAX;
  bool finalizing_ = false;
  FlightRecorder* recorder_ = nullptr;
};

}  // namespace ddp
