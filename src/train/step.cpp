// One optimizer step (step.h).
#include "train/step.h"

#include <cmath>
#include <memory>
#include <sstream>
#include <vector>

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
  if (replica_.fused()) replica_.fused_update().begin_step(rec.lr, rec.log);
  for (int64_t m = 0; m < micro_batches; ++m) {
    DDP_CHECK(m == 0 || feed.advance(), rec.where() << "the data ended inside the step");
    micro_batch(feed.take(), m == 0, m + 1 == micro_batches, loss_scale, rec);
  }
  rec.works = replica_.reducer().works();  // finalized: the gradients are averaged
  const Mark update_begin = rec.traced ? ctx_.mark() : Mark{};
  Mark update_end;
  if (replica_.sharded()) {
    update_shard(rec, update_end);
  } else {
    update_replica(rec);
    if (rec.traced) update_end = ctx_.mark();
  }
  if (rec.traced) trace_update(update_begin, update_end, rec);
}

// Every rank holds the whole averaged gradient and updates every parameter.
void Step::update_replica(StepRecord& rec) {
  Tensor grads = replica_.gradients();
  if (replica_.path().scans_gradients)
    rec.skipped = !gradients_usable(be_.count_nonfinite(grads), rec);
  if (rec.skipped) return;
  const double clip = cfg_.training.clip_grad_norm;
  if (clip > 0 || rec.log) {
    be_.clip_grad_norm_deferred(grads, clip, rec.slot);
    rec.has_norm = rec.norm_in_slot = true;
  }
  replica_.optimizer().step(be_, replica_.parameters(), grads, rec.lr);
}

// ZeRO-1: this rank's parts of the buckets hold the averaged gradient; the optimizer updates
// them (fused: it already has, inside the reduce-scatters) and the allgather brings the others'
// parts (on skipped steps too: it also tells every rank that its gradient buckets are no longer
// read). Each rank's squared norm and non-finite count of its parts reach every rank and are added
// in rank order (the same sums everywhere). When the update depends on them (clipping, nan_policy
// skip_step) they travel first, in a small allgather; otherwise, on the CPU, they ride on the
// parameter allgather and are checked after it (a non-finite gradient still stops every rank), one
// synchronisation per step fewer. On a GPU the totals make the host wait for the gradients
// (l2_norm, count_nonfinite): only on steps that need them (clipping, skip_step, logged steps).
void Step::update_shard(StepRecord& rec, Mark& update_end) {
  const double clip = cfg_.training.clip_grad_norm;
  const bool check = replica_.path().scans_gradients, norm = clip > 0 || rec.log;
  const bool decide_first = replica_.path().totals_first;
  const bool totals = check || norm;
  std::vector<double> mine = totals ? shard_totals(norm) : std::vector<double>{};
  if (totals && decide_first) {
    std::vector<double> all(mine.size() * static_cast<size_t>(comm_.size()));
    comm_.allgather(mine.data(), mine.size(), all.data());
    apply_totals(all, norm, rec);
  }
  if (replica_.fused()) {
    mine = replica_.fused_update().end_step();  // the update ran in the reduce-scatters
  } else if (!rec.skipped) {
    Tensor grads = replica_.gradients();
    const float coef = clip > 0 ? clip_coefficient(rec.grad_norm, clip) : 1.0f;
    if (coef < 1.0f) {  // as Backend::clip_grad_norm_deferred scales
      for (const Span& s : replica_.shards().owned) {
        Tensor g = part(grads, s);
        be_.scale(g, coef);
      }
    }
    replica_.optimizer().step(be_, replica_.parameters(), grads, rec.lr);
  }
  if (rec.traced) update_end = ctx_.mark();
  ScalarRiders riders;
  if (totals && !decide_first) riders = {mine, std::make_shared<std::vector<double>>()};
  const std::shared_ptr<std::vector<double>> all = riders.all;
  const std::shared_ptr<Work> gathered = replica_.allgather_parameters(std::move(riders));
  try {
    gathered->wait();
  } catch (const Error& e) {
    DDP_THROW(rec.where() << e.message());
  }
  if (all) apply_totals(*all, norm, rec);
}

Tensor Step::part(const Tensor& arena, const Span& s) {
  return Tensor{arena.data + s.offset, 1, static_cast<int64_t>(s.numel), arena.device};
}

// This rank's parts: {the squared L2 norm (when `norm`), the non-finite count}.
std::vector<double> Step::shard_totals(bool norm) {
  std::vector<double> mine = {0.0, 0.0};
  if (replica_.fused()) return mine;  // taken in the fused pass (end_step)
  const Tensor grads = replica_.gradients();
  for (const Span& s : replica_.shards().owned) {
    const double part_norm = norm ? be_.l2_norm(part(grads, s)) : 0.0;
    mine[0] += part_norm * part_norm;
    mine[1] += static_cast<double>(be_.count_nonfinite(part(grads, s)));
  }
  return mine;
}

// Every rank's totals (pairs in rank order): the step is skipped, or stops the job, on a
// non-finite value; the norm is theirs summed in rank order.
void Step::apply_totals(const std::vector<double>& all, bool norm, StepRecord& rec) {
  double squares = 0.0, nonfinite = 0.0;
  for (size_t q = 0; q < all.size(); q += 2) {
    squares += all[q];
    nonfinite += all[q + 1];
  }
  rec.skipped = !gradients_usable(static_cast<int64_t>(nonfinite), rec);
  rec.grad_norm = std::sqrt(squares);
  rec.has_norm = norm && !rec.skipped;
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

// The update's spans and the step's on the timeline (sharded: the optimizer of this rank's
// parts, then the parameter allgather); the layer observer (which refers to `rec`) goes.
void Step::trace_update(const Mark& update_begin, const Mark& update_end, StepRecord& rec) {
  replica_.model().set_layer_observer(nullptr);
  const Mark end = ctx_.mark();
  const std::string what = std::string("optimizer (") + to_string(cfg_.optimizer.name) +
                           (replica_.sharded() ? ", this rank's shard)" : ")");
  // Fused, the update ran inside each bucket's reduce-scatter (the lane's spans).
  if (!replica_.fused())
    rec.spans.push_back({report_.compute_track(), what, update_begin, update_end});
  if (replica_.sharded())
    rec.spans.push_back({report_.compute_track(), "parameter allgather", update_end, end});
  rec.spans.push_back(
      {report_.compute_track(), "step " + std::to_string(rec.global_step), rec.begin, end});
}

// `bad` non-finite values in the averaged gradient: the same count on every rank, so all decide
// alike: false when the step must be skipped (nan_policy skip_step); with abort, throws.
bool Step::gradients_usable(int64_t bad, StepRecord& rec) {
  const bool skip_nonfinite = cfg_.training.nan_policy == NanPolicy::SkipStep;
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
