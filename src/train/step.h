// One optimizer step of one rank, top to bottom (Step::run): for each micro-batch forward,
// loss and backward, with every gradient announced to the Reducer the moment it is final so
// full buckets start their allreduce while backward goes on; then finalize (the gradients are
// averaged over ranks), the non-finite check and the optimizer. What the step leaves to be read
// once the device has run it (at once on the host, a step later on a GPU) is its StepRecord.
// The averaged gradient's norm is computed when training.clip_grad_norm clips it, and on
// logged steps for the progress line. With a sharded optimizer (ZeRO-1) each rank checks,
// clips and updates its parts of the buckets, and the allgather brings the others' parts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/config.h"
#include "comm/process_group.h"
#include "kernels/backend.h"
#include "train/device_context.h"
#include "train/replica.h"
#include "train/report.h"

namespace ddp {

/// A traced span whose times are resolved when its step is read.
struct TraceSpan {
  int track;
  std::string name;
  Mark begin, end;
};

/// One optimizer step as it is queued: where it is, its loss totals (a backend slot, read
/// later), its collectives, the moments of backward and what the timeline shows of it.
struct StepRecord {
  int64_t epoch = 0;          ///< 0-based
  int64_t step_in_epoch = 0;  ///< 1-based, this step included
  int64_t global_step = 0;    ///< 1-based, this step included
  int slot = 0;               ///< the backend's loss totals slot
  int64_t rows = 0;           ///< samples of this rank in the step
  bool log = false;           ///< ends a progress-line interval
  bool traced = false;
  bool skipped = false;       ///< non-finite gradients: no update (nan_policy skip_step)
  double lr = 0.0;            ///< the learning rate of the update (the schedule's)
  bool has_norm = false;      ///< the gradient norm was computed (clipping, or a logged step)
  bool norm_in_slot = false;  ///< it waits in the backend's norm slot (read with the step)
  double grad_norm = 0.0;     ///< the averaged gradient's L2 norm before clipping, once read
  double wait_seconds = 0.0;  ///< the training thread's wait for the buckets in finalize
  int64_t first_rows = 0;     ///< rows of the first micro-batch (for the shapes line)
  std::vector<std::shared_ptr<Work>> works;
  Mark begin;  ///< traced steps: when the first micro-batch started
  Mark backward_begin, backward_end;
  double backward_cpu = 0.0;  ///< the training thread's CPU time in the last backward
  std::vector<TraceSpan> spans;
  std::vector<std::pair<std::string, Mark>> instants;  ///< on the compute track

  /// The step's loss totals, read from the backend once (it waits for the step's loss).
  const XentResult& totals(Backend& be);
  /// "epoch E step S: " for messages.
  std::string where() const;

 private:
  bool has_totals_ = false;
  XentResult totals_;
};

class Step {
 public:
  Step(const TrainConfig& cfg, DeviceContext& ctx, Replica& replica, ProcessGroup& comm,
       Reporter& report);

  /// Runs one optimizer step over the next `micro_batches` batches of `feed` (whose current
  /// batch is the step's first; it is left on the step's last), `rows` samples of this rank in
  /// all, with learning rate rec.lr. Fills `rec` (epoch, step numbers, slot, lr and log set by
  /// the caller).
  void run(BatchFeed& feed, int64_t micro_batches, int64_t rows, StepRecord& rec);

 private:
  void micro_batch(const DeviceBatch& batch, bool first, bool last, float loss_scale,
                   StepRecord& rec);
  void backward(const Tensor& dlogits, bool accumulate, bool sync, StepRecord& rec);
  void update_replica(StepRecord& rec);
  void update_shard(StepRecord& rec, Mark& update_end);
  static Tensor part(const Tensor& arena, const Span& s);
  std::vector<double> shard_totals(bool norm);
  void apply_totals(const std::vector<double>& all, bool norm, StepRecord& rec);
  bool gradients_usable(int64_t nonfinite, StepRecord& rec);
  void trace_update(const Mark& update_begin, const Mark& update_end, StepRecord& rec);

  const TrainConfig& cfg_;
  DeviceContext& ctx_;
  Backend& be_;
  Replica& replica_;
  ProcessGroup& comm_;
  Reporter& report_;
  Mark layer_begin_;
};

}  // namespace ddp
