// The timeline of the traced steps (output.trace, the first output.trace_steps of a run), as an
// observer of the step: per-layer forward and backward spans, "bucket k ready" instants, the
// update's spans and one span per step on the compute track, and each bucket's collective on the
// comm track. A step's moments are Marks taken while it is queued and resolved when it is read
// (on a GPU a step later). While a step is not traced every call returns at once, takes no mark
// and records nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/reducer.h"
#include "comm/work.h"
#include "nn/sequential.h"
#include "train/device_context.h"
#include "train/report.h"

namespace ddp {

class StepTrace {
 public:
  /// What a traced step leaves to write once it is read (empty when it is not traced).
  struct Recording {
    struct Span {
      std::string name;
      Mark begin, end;
    };
    std::vector<Span> spans;                             ///< on the compute track
    std::vector<std::pair<std::string, Mark>> instants;  ///< on the compute track
  };

  /// `optimizer`: the optimizer's name, for the update's span. `model` outlives this trace.
  StepTrace(DeviceContext& ctx, Reporter& report, Sequential& model, std::string optimizer);
  /// Removes the model's layer observer if it is installed.
  ~StepTrace();
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

  /// A step begins, traced or not. The model's layer observer is installed when tracing starts
  /// and removed when it stops; it records only inside a traced step (not in an evaluation).
  void begin_step(bool traced);
  /// The gradient just marked ready launched buckets [from, to).
  void buckets_launched(size_t from, size_t to);
  /// The update (optimizer) begins / ends; sharded, the parameter allgather follows its end.
  void update_begins();
  void update_ends();
  /// The step is queued: its update's spans (none for the optimizer when `fused`: it ran in the
  /// reduce-scatters; `sharded`: the optimizer of this rank's shard, then the parameter
  /// allgather) and the step's own span. Returns what the step recorded.
  Recording end_step(int64_t global_step, bool sharded, bool fused);
  /// A step is read: its recording and its buckets' collectives (`works`, completed, in bucket
  /// order of `plan`; reduce-scatters when `sharded`) into the tracer.
  void write(const Recording& recording, const std::vector<std::shared_ptr<Work>>& works,
             const BucketPlan& plan, bool sharded, int64_t global_step);

 private:
  void observe_layer(const std::string& name, bool begin);

  DeviceContext& ctx_;
  Reporter& report_;
  Sequential& model_;
  const std::string optimizer_;
  bool observing_ = false;  ///< the layer observer is installed
  bool recording_ = false;  ///< inside a traced step
  Recording current_;
  Mark step_begin_, layer_begin_, update_begin_, update_end_;
};

}  // namespace ddp
