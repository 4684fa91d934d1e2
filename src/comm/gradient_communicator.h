// The gradient communicators, what the Reducer drives: GradientCommunicator (the gradient
// arena and the asynchronous allreduce of its buckets, PyTorch DDP's comm hook), with the
// sharded optimizer's collectives ShardedCommunicator, with the host's lane hooks, fused update
// and riders HostGradientCommunicator; each implementation derives from what it has, so none
// refuses a method it inherits. The control messages are the ProcessGroup's
// (process_group.h). The MPI implementation runs them on a communication lane
// per rank (src/comm/mpi/lane.h): its own thread drives them while the training thread computes
// the rest of backward (Open MPI does not progress a non-blocking collective unless someone
// calls into MPI), and a thread that waits for one drives them itself. The CUDA communicators
// (src/comm/device_communicators.h) implement it over GPU memory: NCCL on a comm stream, or
// staged through pinned host memory and MPI.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/work.h"
#include "config/gradient_path.h"
#include "core/tensor.h"
#include "ddp/config.h"

namespace ddp {

/// Work a device communicator has done on the communication lane around an MPI collective of
/// host memory: `ready` waits for the data to exist (not timed), `before` stages it into the
/// host buffer, `after` copies the result back. Each may be empty.
struct LaneHooks {
  std::function<void()> ready, before, after;
};

/// A few doubles of every rank that ride on a collective (the sharded step's gradient norm and
/// non-finite count on its parameter allgather): this rank's `mine` (at most kMaxDoubles), every
/// rank's into `*all` (mine.size() x ranks, in rank order). The collective holds `all` itself,
/// so a lost one that returns late writes into memory that still exists.
struct ScalarRiders {
  static constexpr size_t kMaxDoubles = 4;
  std::vector<double> mine;
  std::shared_ptr<std::vector<double>> all;
};

/// The gradient buckets of every rank, summed in place bucket by bucket, each allreduce started
/// as soon as its bucket is complete and finished when its Work is waited on. What every
/// gradient communicator does (MPI, NCCL, staged through host memory).
class GradientCommunicator {
 public:
  virtual ~GradientCommunicator() = default;

  /// Collective, once: `numel` zero-initialised floats for the gradient buckets, owned by the
  /// communicator until it is destroyed, for buckets that travel as `wire` says (the job's
  /// GradientPath decided it; a format or hierarchy this communicator cannot give throws
  /// ddp::Error). allreduce_async on ranges of this memory may take a zero-copy path (MPI: when
  /// every rank is on one node, or a node's ranks with wire.hierarchical, the memory is an MPI
  /// shared-memory window and ranks reduce straight out of each other's buckets, unless
  /// wire.shared_memory is false). Device communicators return device memory.
  ///
  /// wire.format (distributed.compression): later gradient collectives cast each bucket to the
  /// format (comm/compression.h), sum it across ranks in that type, rounding after every
  /// addition, and cast the result back into the float bucket; MPI keeps float32 on one node's
  /// shared memory unless wire.on_node. wire.hierarchical (across nodes with more than one rank
  /// each): a bucket is summed on each node's shared memory, each local rank allreduces its
  /// chunk of the node's sum with the same chunk of every other node, and the node shares the
  /// result back.
  virtual float* gradient_arena(size_t numel, const BucketWire& wire) = 0;

  /// Starts an in-place allreduce of `count` floats; with `average` the result is divided by
  /// the number of ranks. The buffer must not be touched until wait() returns. Collectives
  /// start in call order.
  virtual std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average) = 0;

  /// How long a bucket's collective may take before it is declared lost (a dead or stalled
  /// peer): waiting for it then throws ddp::Error naming the collective and the time, and the
  /// communicator is broken. Default 600 s.
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout() const = 0;
};

/// The sharded optimizer's collectives (distributed.shard_optimizer; comm/shard_plan.h gives
/// each rank's part of a bucket as shard_part(count, ranks, rank)): the MPI and NCCL
/// communicators.
class ShardedCommunicator : public GradientCommunicator {
 public:
  /// Collective, once: room for `numel` zeroed parameters. On one node (and unless
  /// shared=false) one copy in an MPI shared-memory window that every rank of the node maps:
  /// each rank writes its parts and reads all of them, with no copy. Ordinary memory otherwise.
  virtual float* parameter_arena(size_t numel, bool shared) = 0;

  /// Starts a reduce-scatter of the bucket [data, data + count) of the gradient arena: once
  /// waited on, this rank's part holds the sum over ranks (pre-scaled, as with allreduce); the
  /// rest of the bucket is left as it was. Collectives start in call order.
  virtual std::shared_ptr<Work> reduce_scatter_async(float* data, size_t count) = 0;

  /// Starts an allgather of the parameters: every rank's part of each of `buckets` of `arena`
  /// goes to every rank. It is also what tells a rank that its peers have finished reading its
  /// gradient buckets, so one must follow every step's reduce-scatters before backward writes
  /// the gradient arena again. In parameter_arena() memory shared by every rank it is a
  /// barrier.
  virtual std::shared_ptr<Work> allgather_async(float* arena, const std::vector<Span>& buckets) = 0;
};

/// A device communicator whose collectives a graph capture on the compute stream may record
/// (NCCL): they run inside each replay of the graph, where no Work of theirs can be waited on,
/// so a replayed step asks for one fence behind the replay instead.
class CapturableCommunicator {
 public:
  virtual ~CapturableCommunicator() = default;
  /// Numbers this communicator's collectives in `recorder` (null: none), which must outlive
  /// it: the host's communication lane, which numbers the host's, never sees these.
  virtual void set_flight_recorder(FlightRecorder* recorder) = 0;
  /// Whether the compute stream is being captured into a step graph: the collectives queued
  /// meanwhile are the graph's, run (and numbered) at each of its launches. Every graph of one
  /// communicator captures the same collectives (a step's buckets).
  virtual void set_capturing(bool capturing) = 0;
  /// A Work that completes once the device has run everything queued on the compute stream so
  /// far (a replayed graph's collectives among it): wait() rethrows the communicator's errors,
  /// synchronize() blocks under the timeout with the same checks as a bucket's, naming `what`.
  /// It has no times of its own (start_time() = end_time() = 0). Called after each launch of
  /// a step graph: the graph's collectives are numbered as issued now, ending with the fence.
  virtual std::shared_ptr<Work> fence(std::string what) = 0;
};

/// What only the host communicator (MPI, on its communication lane) does besides: collectives
/// with lane hooks (the staged GPU communicator's copies), the sharded update fused into the
/// reduce-scatters (distributed.overlap_optimizer), scalars riding on the allgather, and a
/// bucket's own reduction (PowerSGD).
class HostGradientCommunicator : public ShardedCommunicator {
 public:
  /// allreduce_async with `hooks` run on the communication lane around it.
  virtual std::shared_ptr<Work> allreduce_on_lane(float* data, size_t count, bool average,
                                                  const LaneHooks& hooks) = 0;

  /// This rank's summed part of a bucket handed over instead of stored: `at` is where in the
  /// gradient arena the `n` summed floats belong, `sum` holds them (valid during the call
  /// only). Called on the communication lane, in arena order, once or more per bucket (on one
  /// node a block at a time, while the block is still in cache).
  using PartConsumer = std::function<void(float* at, const float* sum, size_t n)>;

  /// reduce_scatter_async with this rank's part of the sum going to `consume`; afterwards that
  /// part of the arena holds the sum or what was there.
  virtual std::shared_ptr<Work> reduce_scatter_into_async(float* data, size_t count,
                                                          PartConsumer consume) = 0;

  /// allgather_async with `riders` (every rank's into riders.all, in rank order).
  virtual std::shared_ptr<Work> allgather_with_riders(float* arena,
                                                      const std::vector<Span>& buckets,
                                                      ScalarRiders riders) = 0;

  /// A sum over ranks of `count` host floats in place: blocking, the same bits on every rank.
  using SumOverRanks = std::function<void(float* data, size_t count)>;
  /// A bucket's own reduction (PowerSGD's factors, comm/powersgd.h): it turns this rank's share
  /// in [data, data + count) into the reduced bucket, calling `sum` as often as it needs, every
  /// rank alike.
  using BucketReduction = std::function<void(float* data, size_t count, const SumOverRanks& sum)>;
  /// Runs `reduce` on the bucket [data, data + count) of the gradient arena on the
  /// communication lane, in order with the other collectives, under the timeout; `what` and
  /// `bytes` (sent by this rank) name it in errors and the flight recorder. What `reduce`
  /// captures must outlive a lost collective (it may return after the caller gave up).
  virtual std::shared_ptr<Work> reduce_on_lane(std::string what, size_t bytes, float* data,
                                               size_t count, BucketReduction reduce) = 0;

  /// Collective, once: an array of `count` doubles for exact sums (zeroed), in memory the
  /// ranks of a node map together where `shared` allows and they all are on one node.
  virtual double* exact_sum_arena(size_t count, bool shared) = 0;
  /// What receives the exact sums: [first, first + n) of the summed array, in `sums` (valid
  /// during the call only). Called on the communication lane, once for each part of the array.
  using ExactConsumer = std::function<void(size_t first, const double* sums, size_t n)>;
  /// The sum over ranks of the exact_sum_arena, handed to `consume` part by part, on the
  /// communication lane under the timeout: on one node straight from the ranks' shared memory
  /// (the array keeps only what this rank summed), else after Open MPI's allreduce. Its values
  /// must have exact partial sums (comm/exact_sum.h): any order of the additions gives the same
  /// bits. What `consume` uses must outlive a lost collective. Between two of these calls the
  /// ranks must meet in another collective (an allgather) before writing the array again: peers
  /// may read it until they reach that one.
  virtual std::shared_ptr<Work> allreduce_exact_async(ExactConsumer consume) = 0;
};

}  // namespace ddp
