// One optimizer step (step.h).
#include "train/step.h"

#include <cmath>
#include <sstream>

#include "core/check.h"
#include "core/clock.h"

namespace ddp {

const XentResult& StepRecord::totals(Backend& be) {
  if (has_totals_) return totals_;
  try {
    totals_ = be.take_xent_totals(slot);
  } catch (const Error& e) {
    DDP_THROW(where() << e.message());
  }
  has_totals_ = true;
  return totals_;
}

std::string StepRecord::where() const {
  return "epoch " + std::to_string(epoch + 1) + " step " + std::to_string(step_in_epoch) + ": ";
}

Step::Step(const TrainConfig& cfg, DeviceContext& ctx, Replica& replica, ProcessGroup& comm,
           Reporter& report)
    : cfg_(cfg), ctx_(ctx), be_(ctx.backend()), replica_(replica), comm_(comm), report_(report) {}

void Step::run(BatchFeed& feed, int64_t micro_batches, int64_t rows, StepRecord& rec) {
  // The gradient is a mean over every sample of the optimizer step: all micro-batches and,
  // because the Reducer sums over ranks, all ranks (DDP's 1/world pre-scale, folded in here).
  // So the step means what one process would do with the global batch.
  const float loss_scale = 1.0f / static_cast<float>(rows * comm_.size());
  for (int64_t m = 0; m < micro_batches; ++m) {
    DDP_CHECK(m == 0 || feed.advance(), rec.where() << "the data ended inside the step");
    micro_batch(feed.take(), m == 0, m + 1 == micro_batches, loss_scale, rec);
  }
  rec.works = replica_.reducer().works();  // finalized: the gradients are averaged
  rec.skipped = !gradients_usable(rec);
  const Mark update_begin = rec.traced ? ctx_.mark() : Mark{};
  if (!rec.skipped) {
    const double clip = cfg_.training.clip_grad_norm;
    Tensor grads = replica_.gradients();
    if (clip > 0 || rec.log) {
      be_.clip_grad_norm_deferred(grads, clip, rec.slot);
      rec.has_norm = true;
    }
    replica_.optimizer().step(be_, replica_.parameters(), grads, rec.lr);
  }
  if (rec.traced) trace_update(update_begin, rec);
}

// Forward, the loss (its totals stay on the device until the step is read) and backward.
void Step::micro_batch(const DeviceBatch& batch, bool first, bool last, float loss_scale,
                       StepRecord& rec) {
  rec.rows += batch.rows;
  if (first) rec.first_rows = batch.rows;
  if (first && rec.traced) rec.begin = ctx_.mark();
  Sequential& model = replica_.model();
  if (rec.traced) {
    model.set_layer_observer([this, &rec](const std::string& name, bool begin) {
      if (begin) {
        layer_begin_ = ctx_.mark();
      } else {
        rec.spans.push_back({report_.compute_track(), name, layer_begin_, ctx_.mark()});
      }
    });
  } else {
    model.set_layer_observer(nullptr);
  }
  const Tensor& logits = model.forward(be_, batch.x);
  Tensor dlogits = replica_.dlogits(batch.rows);
  be_.softmax_xent_deferred(logits, batch.labels, loss_scale, &dlogits, rec.slot);
  backward(dlogits, /*accumulate=*/!first, /*sync=*/last, rec);
}

// Each parameter's gradient is announced the moment it is final; the Reducer launches every
// bucket that is then full. Only the last micro-batch communicates (sync); its finalize waits
// for every bucket.
void Step::backward(const Tensor& dlogits, bool accumulate, bool sync, StepRecord& rec) {
  Reducer& reducer = replica_.reducer();
  reducer.prepare_for_backward(sync);
  rec.backward_begin = ctx_.mark();
  const double cpu0 = thread_cpu_seconds();
  try {
    replica_.model().backward(be_, dlogits, accumulate, [&](size_t param) {
      const size_t before = reducer.launched();
      reducer.mark_ready(param);
      if (!rec.traced) return;
      for (size_t b = before; b < reducer.launched(); ++b)
        rec.instants.emplace_back("bucket " + std::to_string(b) + " ready", ctx_.mark());
    });
    rec.backward_end = ctx_.mark();
    rec.backward_cpu = thread_cpu_seconds() - cpu0;
    if (sync) rec.wait_seconds += reducer.finalize();
  } catch (const Error& e) {
    DDP_THROW(rec.where() << e.message());
  }
}

// The optimizer's span and the step's on the timeline; the layer observer (which refers to
// `rec`) goes.
void Step::trace_update(const Mark& update_begin, StepRecord& rec) {
  replica_.model().set_layer_observer(nullptr);
  const Mark end = ctx_.mark();
  rec.spans.push_back({report_.compute_track(), "optimizer (SGD)", update_begin, end});
  rec.spans.push_back(
      {report_.compute_track(), "step " + std::to_string(rec.global_step), rec.begin, end});
}

// The averaged gradient is the same on every rank, so each rank decides alone and all decide
// alike: false when the step must be skipped (nan_policy skip_step); with abort, throws.
bool Step::gradients_usable(StepRecord& rec) {
  const bool skip_nonfinite = cfg_.training.nan_policy == NanPolicy::SkipStep;
  if (!ctx_.checks_gradients(skip_nonfinite)) return true;
  const int64_t bad = be_.count_nonfinite(replica_.gradients());
  if (bad == 0) return true;
  // Collective: which rank's loss went non-finite, for the message.
  double first_bad = std::isfinite(rec.totals(be_).loss_sum) ? comm_.size() : comm_.rank();
  comm_.allreduce(&first_bad, 1, ReduceOp::Min);
  std::ostringstream msg;
  msg << rec.where() << bad << " non-finite gradient value(s) after the allreduce";
  if (first_bad < comm_.size()) {
    msg << " (the loss was non-finite on rank " << static_cast<int>(first_bad) << ")";
  } else {
    msg << " (every rank's loss was finite)";
  }
  if (!skip_nonfinite) {
    throw CollectiveError(msg.str() +
                          "; lower optimizer.lr? training.nan_policy: skip_step skips such steps");
  }
  report_.say("warning: " + msg.str() + ": step skipped (training.nan_policy: skip_step)");
  report_.record({{"type", "skipped_step"},
                  {"epoch", rec.epoch + 1},
                  {"step", rec.step_in_epoch},
                  {"global_step", rec.global_step},
                  {"nonfinite_values", bad}});
  return false;
}

}  // namespace ddp
