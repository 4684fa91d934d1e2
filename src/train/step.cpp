// One optimizer step and the steps queued on the device (step.h).
#include "train/step.h"

#include <cmath>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/clock.h"

namespace ddp {

StepPipeline::StepPipeline(const TrainConfig& cfg, DeviceContext& ctx, Replica& replica,
                           ProcessGroup& comm, Reporter& report)
    : cfg_(cfg),
      ctx_(ctx),
      be_(ctx.backend()),
      replica_(replica),
      comm_(comm),
      report_(report),
      trace_(ctx, report, replica.model(), to_string(cfg.optimizer.name)),
      scaler_(replica.path().loss_scaling, cfg.training.loss_scale_init,
              cfg.training.loss_scale_growth_interval) {
  capturable_ = replica.capturable();
  if (cfg.training.cuda_graphs && be_.captures_graphs() && capturable_ != nullptr &&
      !replica.fused())
    graphs_ = std::make_unique<StepGraphs>(be_);
  if (const int64_t chunk = replica.path().exact_chunk) {
    const ChunkLayout layout{chunk, cfg.training.batch_size, cfg.training.accumulate_steps,
                             comm.size()};
    chunked_ = std::make_unique<ChunkedGradients>(
        replica.model(), replica.plan(), layout, replica.host(), replica.path().wire.shared_memory);
  }
}

std::optional<StepResult> StepPipeline::step(BatchFeed& feed, const StepInputs& in) {
  InFlight& s = queue(in);
  if (FlightRecorder* flight = replica_.flight_recorder()) flight->set_step(in.global_step);
  trace_.begin_step(in.traced);
  // The gradient is a mean over every sample of the optimizer step: all micro-batches and,
  // because the Reducer sums over ranks, all ranks (DDP's 1/world pre-scale, folded in here).
  // So the step means what one process would do with the global batch. With loss scaling the
  // coefficient is scale / samples, as torch's (loss * scale).backward() rounds it.
  const float loss_coef = scaler_.loss_coefficient(in.rows * comm_.size());
  s.result.loss_scale = scaler_.scale();
  if (replica_.fused()) replica_.fused_update().begin_step(in.lr, in.log);
  if (chunked_) {
    queue_chunked(feed, s, in, loss_coef);
  } else if (graphs_ && !in.log && !in.traced && in.micro_batches == 1) {
    queue_graphed(feed, s, loss_coef);
  } else {
    for (int64_t m = 0; m < in.micro_batches; ++m) {
      DDP_CHECK(m == 0 || feed.advance(), s.where() << "the data ended inside the step");
      queue_batch(feed.take(), s, loss_coef, m == 0, m + 1 == in.micro_batches, true);
    }
    s.works = replica_.reducer().works();
  }
  // The non-finite check, the clipping and the optimizer.
  trace_.update_begins();
  if (replica_.sharded()) {
    update_shard(s);  // the update's end is before its parameter allgather
  } else {
    update_replica(s);
    trace_.update_ends();
  }
  s.trace = trace_.end_step(in.global_step, replica_.sharded(), replica_.fused());
  if (queue_.size() <= ctx_.pipeline_depth()) return std::nullopt;
  return read_oldest();
}

// One batch of the step: forward, the loss (its totals stay on the device until the step is
// read) and backward, where each gradient is announced the moment it is final and the Reducer
// launches every bucket then full. Only the last micro-batch communicates (sync); its finalize
// makes what follows wait for every bucket: the gradients are averaged over ranks. `observed`:
// the backward's moments are marked for the overlap statistics (not inside a graph capture,
// where a mark would time nothing).
void StepPipeline::queue_batch(const DeviceBatch& batch, InFlight& s, float loss_coef, bool first,
                               bool last, bool observed) {
  Sequential& model = replica_.model();
  Reducer& reducer = replica_.reducer();
  s.result.rows += batch.rows;
  const Tensor& logits = model.forward(be_, batch.x);
  Tensor dlogits = replica_.dlogits(batch.rows);
  be_.softmax_xent_deferred(logits, batch.labels, loss_coef, &dlogits, s.slot);
  reducer.prepare_for_backward(/*sync=*/last);
  if (observed) s.backward_begin = ctx_.mark();
  const double cpu0 = thread_cpu_seconds();
  try {
    model.backward(be_, dlogits, /*accumulate=*/!first, [&](size_t param) {
      const size_t before = reducer.launched();
      reducer.mark_ready(param);
      trace_.buckets_launched(before, reducer.launched());
    });
    if (observed) s.backward_end = ctx_.mark();
    s.backward_cpu = thread_cpu_seconds() - cpu0;
    if (last) s.result.wait_seconds += reducer.finalize();
  } catch (const Error& e) {
    DDP_THROW(s.where() << e.message());
  }
}

// A step of one batch that neither logs nor is traced, as a graph (step_graphs.h): the batch is
// taken first (its upload's events are outside the graph), then its forward, loss and backward
// with the bucket collectives are replayed, or run eagerly the first time. A replayed step's
// collectives are waited on through one fence behind the graph.
void StepPipeline::queue_graphed(BatchFeed& feed, InFlight& s, float loss_coef) {
  const DeviceBatch batch = feed.take();
  const StepGraphs::Key key{batch.x.data, batch.labels, batch.rows, loss_coef, s.slot};
  const bool graphed = graphs_->run(key, [&](bool captured) {
    capturable_->set_capturing(captured);
    try {
      queue_batch(batch, s, loss_coef, true, true, /*observed=*/!captured);
    } catch (...) {
      capturable_->set_capturing(false);
      throw;
    }
    capturable_->set_capturing(false);
  });
  if (!graphed) {
    s.works = replica_.reducer().works();
    return;
  }
  s.result.rows = batch.rows;  // a replay queued no batch: count it once
  s.result.graphed = true;
  s.fence = capturable_->fence("the collectives of a replayed step graph");
}

// training.bitwise_across_world_sizes: each micro-batch chunk by chunk, then the exact sum over
// every rank's chunks, which also gives the step's loss totals of the whole job. No bucket
// collectives: the one allreduce is in finish.
void StepPipeline::queue_chunked(BatchFeed& feed, InFlight& s, const StepInputs& in,
                                 float loss_coef) {
  Sequential& model = replica_.model();
  chunked_->begin_step();
  s.backward_begin = ctx_.mark();
  const double cpu0 = thread_cpu_seconds();
  try {
    for (int64_t m = 0; m < in.micro_batches; ++m) {
      DDP_CHECK(m == 0 || feed.advance(), "the data ended inside the step");
      const DeviceBatch batch = feed.take();
      s.result.rows += batch.rows;
      chunked_->add_micro_batch(be_, model, batch.x, batch.labels, batch.rows, loss_coef,
                                replica_.dlogits(batch.rows));
    }
    s.backward_end = ctx_.mark();
    s.backward_cpu = thread_cpu_seconds() - cpu0;
    const double wait0 = seconds_now();
    s.result.totals = chunked_->finish(comm_, model, replica_.parameters(), replica_.gradients());
    s.result.wait_seconds += seconds_now() - wait0;
  } catch (const Error& e) {
    DDP_THROW(s.where() << e.message());
  }
  s.result.job_totals = s.totals_read = true;
}

// The oldest queued step, once the device has run it: its loss totals (checked) and gradient
// norm, its collectives completed under the timeout and timed for the overlap statistics, and
// its timeline.
StepResult StepPipeline::read_oldest() {
  InFlight s = std::move(queue_.front());
  queue_.pop_front();
  StepResult& r = s.result;
  const double loss = totals(s).loss_sum;
  if (s.norm_in_slot) r.grad_norm = be_.take_grad_norm(s.slot);
  if (!std::isfinite(loss)) {
    DDP_CHECK(cfg_.training.nan_policy == NanPolicy::SkipStep,
              "loss is " << loss << " at epoch " << r.epoch + 1 << " step " << r.step_in_epoch
                         << " (lower optimizer.lr? training.nan_policy: skip_step skips such "
                            "steps)");
  }
  try {
    if (s.fence) {
      s.fence->synchronize();
    } else {
      replica_.reducer().synchronize(s.works, r.global_step);
    }
  } catch (const Error& e) {
    DDP_THROW(s.where() << e.message());
  }
  if (s.fence) return r;  // a graph: no times of its collectives (those of logged steps count)
  const double begin = s.backward_begin.time(), end = s.backward_end.time();
  const BackwardWindow window{begin, end, ctx_.compute_seconds(begin, end, s.backward_cpu)};
  const ReducerStepStats stats = overlap_stats(s.works, window);
  // Chunked: the exact sums come after every chunk's backward, nothing of them hidden.
  r.comm_seconds = chunked_ ? r.wait_seconds : stats.comm_seconds;
  r.hidden_seconds = chunked_ ? 0.0 : stats.hidden_seconds;
  r.collective_wait = ctx_.host_waits_for_buckets() ? r.wait_seconds : bucket_wait(s.works);
  r.wait_timed = true;
  trace_.write(s.trace, s.works, replica_.plan(), replica_.sharded(), r.global_step);
  return r;
}

std::vector<StepResult> StepPipeline::drain() {
  std::vector<StepResult> read;
  while (!queue_.empty()) read.push_back(read_oldest());
  return read;
}

// A new step at the back of the queue; its loss totals go to the slot the step before it does
// not use (that one may still be waiting to be read).
StepPipeline::InFlight& StepPipeline::queue(const StepInputs& in) {
  InFlight& s = queue_.emplace_back();
  s.result.epoch = in.epoch;
  s.result.step_in_epoch = in.step_in_epoch;
  s.result.global_step = in.global_step;
  s.result.lr = in.lr;
  s.result.log = in.log;
  s.slot = static_cast<int>((in.global_step - 1) % 2);
  return s;
}

std::string StepPipeline::InFlight::where() const {
  return "epoch " + std::to_string(result.epoch + 1) + " step " +
         std::to_string(result.step_in_epoch) + ": ";
}

// The step's loss totals, read from the backend once (it waits for the step's loss).
const XentResult& StepPipeline::totals(InFlight& s) {
  if (s.totals_read) return s.result.totals;
  try {
    s.result.totals = be_.take_xent_totals(s.slot);
  } catch (const Error& e) {
    DDP_THROW(s.where() << e.message());
  }
  s.totals_read = true;
  return s.result.totals;
}

// Every rank holds the whole averaged gradient and updates every parameter.
void StepPipeline::update_replica(InFlight& s) {
  StepResult& r = s.result;
  Tensor grads = replica_.gradients();
  unscale(grads);
  if (replica_.path().scans_gradients) r.skipped = !gradients_usable(be_.count_nonfinite(grads), s);
  if (r.skipped) return;
  const double clip = cfg_.training.clip_grad_norm;
  if (clip > 0 || r.log) {
    be_.clip_grad_norm_deferred(grads, clip, s.slot);
    r.has_norm = s.norm_in_slot = true;
  }
  replica_.optimizer().step(be_, replica_.parameters(), grads, r.lr);
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
void StepPipeline::update_shard(InFlight& s) {
  StepResult& rec = s.result;
  const double clip = cfg_.training.clip_grad_norm;
  const bool check = replica_.path().scans_gradients, norm = clip > 0 || rec.log;
  const bool decide_first = replica_.path().totals_first;
  const bool totals = check || norm;
  if (!replica_.fused()) unscale(replica_.gradients());  // with loss scaling never fused
  std::vector<double> mine = totals ? shard_totals(norm) : std::vector<double>{};
  if (totals && decide_first) {
    std::vector<double> all(mine.size() * static_cast<size_t>(comm_.size()));
    comm_.allgather(mine.data(), mine.size(), all.data());
    apply_totals(all, norm, s);
  }
  if (replica_.fused()) {
    mine = replica_.fused_update().end_step();  // the update ran in the reduce-scatters
  } else if (!rec.skipped) {
    Tensor grads = replica_.gradients();
    const float coef = clip > 0 ? clip_coefficient(rec.grad_norm, clip) : 1.0f;
    if (coef < 1.0f) {  // as Backend::clip_grad_norm_deferred scales
      for (const Span& sp : replica_.shards().owned) {
        Tensor g = part(grads, sp);
        be_.scale(g, coef);
      }
    }
    replica_.optimizer().step(be_, replica_.parameters(), grads, rec.lr);
  }
  trace_.update_ends();
  ScalarRiders riders;
  if (totals && !decide_first) riders = {mine, std::make_shared<std::vector<double>>()};
  const std::shared_ptr<std::vector<double>> all = riders.all;
  const std::shared_ptr<Work> gathered = replica_.allgather_parameters(std::move(riders));
  try {
    gathered->wait();
  } catch (const Error& e) {
    DDP_THROW(s.where() << e.message());
  }
  if (all) apply_totals(*all, norm, s);
}

Tensor StepPipeline::part(const Tensor& arena, const Span& s) {
  return Tensor{arena.data + s.offset, 1, static_cast<int64_t>(s.numel), arena.device};
}

// Loss scaling: the averaged gradient (sharded: this rank's parts of it) times 1/scale, as
// GradScaler.unscale_ does before clipping (the norm is the unscaled gradient's) and the update.
// The non-finite count comes after it: torch counts the values before the multiply, the same
// count unless the scale is below 1 and the product overflows, which this way is caught too.
void StepPipeline::unscale(Tensor grads) {
  if (!scaler_.enabled()) return;
  const float inv = scaler_.inv_scale();
  if (!replica_.sharded()) return be_.scale(grads, inv);
  for (const Span& sp : replica_.shards().owned) {
    Tensor g = part(grads, sp);
    be_.scale(g, inv);
  }
}

// This rank's parts: {the squared L2 norm (when `norm`), the non-finite count}.
std::vector<double> StepPipeline::shard_totals(bool norm) {
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
void StepPipeline::apply_totals(const std::vector<double>& all, bool norm, InFlight& s) {
  StepResult& rec = s.result;
  double squares = 0.0, nonfinite = 0.0;
  for (size_t q = 0; q < all.size(); q += 2) {
    squares += all[q];
    nonfinite += all[q + 1];
  }
  rec.skipped = !gradients_usable(static_cast<int64_t>(nonfinite), s);
  rec.grad_norm = std::sqrt(squares);
  rec.has_norm = norm && !rec.skipped;
}

// `bad` non-finite values in the averaged gradient: the same count on every rank, so all decide
// alike: false when the step must be skipped (nan_policy skip_step); with abort, throws.
bool StepPipeline::gradients_usable(int64_t bad, InFlight& s) {
  if (scaler_.enabled()) return scaler_step(bad, s);
  const StepResult& rec = s.result;
  const bool skip_nonfinite = cfg_.training.nan_policy == NanPolicy::SkipStep;
  if (bad == 0) return true;
  const int first_bad = nonfinite_loss_rank(s);
  std::ostringstream msg;
  msg << s.where() << bad << " non-finite gradient value(s) after the allreduce";
  if (first_bad >= 0) {
    msg << " (the loss was non-finite on rank " << first_bad << ")";
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

// Collective (chunked: known alike on every rank already): the lowest rank whose loss of step
// `s` is non-finite, or -1.
int StepPipeline::nonfinite_loss_rank(InFlight& s) {
  if (chunked_) return chunked_->first_nonfinite_loss_rank();
  double first_bad = std::isfinite(totals(s).loss_sum) ? comm_.size() : comm_.rank();
  comm_.allreduce(&first_bad, 1, ReduceOp::Min);
  return first_bad < comm_.size() ? static_cast<int>(first_bad) : -1;
}

// Loss scaling: an overflow of the averaged gradient (`bad` non-finite values, the same on every
// rank) is the scaler's, not nan_policy's: the step is skipped (no update, the optimizer's state
// untouched, the lr schedule goes on, as with torch's scaler.step) and the scale backs off.
// A non-finite loss is still nan_policy's: with abort every rank stops here naming the rank
// (collective; only on overflow steps), with skip_step the scaler skips the step.
bool StepPipeline::scaler_step(int64_t bad, InFlight& s) {
  if (bad > 0 && cfg_.training.nan_policy == NanPolicy::Abort) {
    const int first_bad = nonfinite_loss_rank(s);
    if (first_bad >= 0) {
      throw CollectiveError(s.where() + "the loss was non-finite on rank " +
                            std::to_string(first_bad) +
                            " (lower optimizer.lr? training.nan_policy: skip_step skips such "
                            "steps)");
    }
  }
  s.result.scaler_skipped = bad > 0;
  try {
    scaler_.update(bad > 0);
  } catch (const CollectiveError& e) {
    throw CollectiveError(s.where() + e.what());
  }
  return bad == 0;
}

}  // namespace ddp
