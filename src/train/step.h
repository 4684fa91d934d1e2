// One optimizer step of one rank, top to bottom, and the steps queued on the device
// (StepPipeline::step): for each micro-batch forward, loss and backward, with every gradient
// announced to the Reducer the moment it is final so full buckets start their allreduce while
// backward goes on; then finalize (the gradients are averaged over ranks), the non-finite check
// and the optimizer. What is read back once the device has run the step (at once on the host, a
// step later on a GPU) is its StepResult. The averaged gradient's norm is computed when
// training.clip_grad_norm clips it, and on logged steps for the progress line. With a sharded
// optimizer (ZeRO-1) each rank checks, clips and updates its parts of the buckets, and the
// allgather brings the others' parts. With training.loss_scaling the loss gradient carries the
// LossScaler's scale and the averaged gradient is unscaled before all of that; an overflow skips
// the step and backs the scale off.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "ddp/config.h"
#include "kernels/backend.h"
#include "train/chunked_gradients.h"
#include "train/device_context.h"
#include "train/loss_scaler.h"
#include "train/replica.h"
#include "train/report.h"
#include "train/step_graphs.h"
#include "train/step_trace.h"

namespace ddp {

/// What the loop hands the pipeline for one optimizer step.
struct StepInputs {
  int64_t epoch = 0;          ///< 0-based
  int64_t step_in_epoch = 0;  ///< 1-based, this step included
  int64_t global_step = 0;    ///< 1-based, this step included
  int64_t micro_batches = 0;  ///< batches of the feed the step trains on
  int64_t rows = 0;           ///< samples of this rank in them
  double lr = 0.0;            ///< the learning rate of the update (the schedule's)
  bool log = false;           ///< ends a progress-line interval
  bool traced = false;        ///< on the timeline (output.trace)
};

/// A step once it is read: what the loop tallies and reports of it.
struct StepResult {
  int64_t epoch = 0;  ///< as in StepInputs
  int64_t step_in_epoch = 0;
  int64_t global_step = 0;
  int64_t rows = 0;
  double lr = 0.0;
  bool log = false;
  XentResult totals;            ///< the step's loss totals (non-finite only with skip_step)
  /// totals are the whole job's, the same on every rank (training.bitwise_across_world_sizes),
  /// not this rank's: tallied once.
  bool job_totals = false;
  bool skipped = false;         ///< non-finite gradients: no update (skip_step, or scaler_skipped)
  bool scaler_skipped = false;  ///< loss scaling: the gradient overflowed (skipped is set too)
  float loss_scale = 1.0f;      ///< the loss scale the step ran with (1: no loss scaling)
  bool has_norm = false;        ///< the gradient norm was computed (clipping, or a logged step)
  double grad_norm = 0.0;       ///< the averaged gradient's L2 norm before clipping
  double wait_seconds = 0.0;    ///< the training thread's wait for the buckets in finalize
  /// The rank's wait for its peers' gradients after its backward (the straggler report): the
  /// training thread's in finalize on the host, the device's on a GPU (bucket_wait); valid when
  /// wait_timed (not for a replayed graph, whose collectives have no times).
  double collective_wait = 0.0;
  bool wait_timed = false;
  double comm_seconds = 0.0;    ///< the step's collectives' time (the overlap statistics)
  double hidden_seconds = 0.0;  ///< the part of it hidden behind backward
  bool graphed = false;         ///< its device work ran as a graph (no times of its collectives)
};

class StepPipeline {
 public:
  StepPipeline(const TrainConfig& cfg, DeviceContext& ctx, Replica& replica, ProcessGroup& comm,
               Reporter& report);

  /// Queues one optimizer step over the next in.micro_batches batches of `feed` (whose current
  /// batch is the step's first; it is left on the step's last) and returns the step that is read
  /// now, if any: this one on the host, the one before it on a GPU (ctx.pipeline_depth() steps
  /// stay queued). Failures name "epoch E step S" of the step they happened in.
  std::optional<StepResult> step(BatchFeed& feed, const StepInputs& in);
  /// Reads every step still queued, oldest first (at the end of an epoch, before a checkpoint).
  std::vector<StepResult> drain();
  /// The loss scale and its schedule after the last queued step (decided when it is queued:
  /// what a checkpoint records, and where a resumed run restores it).
  LossScaler& scaler() { return scaler_; }

 private:
  /// A queued step: its result so far and what reading it needs.
  struct InFlight {
    StepResult result;
    int slot = 0;               ///< the backend's loss totals (and norm) slot
    bool totals_read = false;   ///< result.totals holds them
    bool norm_in_slot = false;  ///< the norm waits in the backend's norm slot
    std::vector<std::shared_ptr<Work>> works;
    std::shared_ptr<Work> fence;        ///< a graph's: behind its collectives (works stay empty)
    Mark backward_begin, backward_end;  ///< the last backward, for the overlap statistics
    double backward_cpu = 0.0;          ///< the training thread's CPU time in it
    StepTrace::Recording trace;
    /// "epoch E step S: " for messages.
    std::string where() const;
  };

  InFlight& queue(const StepInputs& in);
  void queue_batch(const DeviceBatch& batch, InFlight& s, float loss_coef, bool first, bool last,
                   bool observed);
  void queue_graphed(BatchFeed& feed, InFlight& s, float loss_coef);
  void queue_chunked(BatchFeed& feed, InFlight& s, const StepInputs& in, float loss_coef);
  StepResult read_oldest();
  const XentResult& totals(InFlight& s);
  void update_replica(InFlight& s);
  void update_shard(InFlight& s);
  static Tensor part(const Tensor& arena, const Span& s);
  void unscale(Tensor grads);
  std::vector<double> shard_totals(bool norm);
  void apply_totals(const std::vector<double>& all, bool norm, InFlight& s);
  bool gradients_usable(int64_t nonfinite, InFlight& s);
  bool scaler_step(int64_t nonfinite, InFlight& s);
  int nonfinite_loss_rank(InFlight& s);

  const TrainConfig& cfg_;
  DeviceContext& ctx_;
  Backend& be_;
  Replica& replica_;
  ProcessGroup& comm_;
  Reporter& report_;
  StepTrace trace_;
  LossScaler scaler_;
  std::deque<InFlight> queue_;          ///< oldest first
  std::unique_ptr<StepGraphs> graphs_;  ///< training.cuda_graphs where the step can be captured
  /// training.bitwise_across_world_sizes: the step's gradient summed exactly over chunks.
  std::unique_ptr<ChunkedGradients> chunked_;
  CapturableCommunicator* capturable_ = nullptr;  ///< the buckets' communicator, if capturable
};

}  // namespace ddp
