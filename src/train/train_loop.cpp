// The epoch loop (train_loop.h).
#include "train/train_loop.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/check.h"
#include "core/clock.h"
#include "data/sampler.h"
#include "train/mfu.h"
#include "train/stop_request.h"

namespace ddp {

TrainLoop::TrainLoop(const RunParts& parts, const TrainingState& start, bool resumed)
    : p_(parts),
      be_(parts.ctx.backend()),
      pipeline_(parts.cfg, parts.ctx, parts.replica, parts.comm, parts.report),
      stop_poll_(parts.comm),
      schedule_(parts.cfg.scheduler, parts.cfg.optimizer.lr,
                start.schedule_steps > 0
                    ? start.schedule_steps
                    : schedule_total_steps(parts.cfg, parts.data.steps_per_epoch(parts.cfg))),
      start_(start),
      at_(start),
      stragglers_(parts.comm.size()) {
  const TrainingData& data = parts.data;
  train_feed_ = parts.ctx.make_batch_feed(parts.cfg.training.batch_size, data.train.features);
  if (data.has_test) test_feed_ = parts.ctx.make_batch_feed(kEvalBatch, data.test.features);
  run_start_ = seconds_now();
  sum_.resumed = resumed;
  sum_.steps = start.global_step;
  sum_.skipped_steps = start.skipped_steps;
  sum_.scaler_skipped_steps = start.scaler_skipped_steps;
  // A checkpoint's loss scale continues (one without: loss_scale_init).
  if (start.loss_scale > 0)
    pipeline_.scaler().restore(static_cast<float>(start.loss_scale),
                               start.loss_scale_growth_tracker);
  note_scaler();
  // Rank 0's threshold: output.* may differ between ranks, and the report is a collective.
  straggler_threshold_ = parts.cfg.output.straggler_threshold;
  parts.comm.broadcast(&straggler_threshold_, sizeof(straggler_threshold_), 0);
  first_step_ = sum_.steps;
  const int64_t max_steps = parts.cfg.training.max_steps;
  stop_ = max_steps > 0 && sum_.steps >= max_steps;
  if (resumed && (start.epoch >= parts.cfg.training.epochs || stop_))
    parts.report.say("resume: the checkpoint is already at the end of training");
}

TrainSummary TrainLoop::run() {
  for (int64_t index = start_.epoch; index < p_.cfg.training.epochs && !stop_; ++index) {
    Epoch e = begin_epoch(index);
    train_steps(e);
    if (!end_epoch(e)) break;
  }
  return finish();
}

// The sampler's order for the epoch (a resumed epoch continues after the samples its
// checkpoint had consumed), the loader started on it, the tallies reset.
TrainLoop::Epoch TrainLoop::begin_epoch(int64_t index) {
  Epoch e;
  e.index = index;
  e.start_time = seconds_now();
  const bool continued = index == start_.epoch && start_.epoch_position > 0;
  e.position = continued ? start_.epoch_position : 0;
  DistributedSampler& sampler = *p_.data.sampler;
  sampler.set_epoch(index, e.position);
  p_.data.train_loader->start_epoch(sampler.indices());
  e.batches = p_.data.train_loader->batches_in_epoch();
  e.shard = sampler.num_samples();
  e.step_in_epoch = continued ? start_.step_in_epoch : 0;
  const int64_t A = p_.cfg.training.accumulate_steps;
  steps_in_epoch_ = e.step_in_epoch + (e.batches + A - 1) / A;
  epoch_tally_ = log_tally_ = Tally{};
  if (continued && p_.comm.rank() == 0)
    epoch_tally_ = Tally{start_.epoch_loss_sum, start_.epoch_correct, start_.epoch_count};
  e.restored_count = continued ? start_.epoch_count : 0.0;
  e.complete = e.batches == 0;
  log_start_ = seconds_now();
  log_data_wait_start_ = p_.data.train_loader->wait_seconds();
  log_waits_.reset();
  return e;
}

// The epoch's optimizer steps, each over accumulate_steps micro-batches (fewer at the end).
void TrainLoop::train_steps(Epoch& e) {
  const int64_t A = p_.cfg.training.accumulate_steps, B = p_.cfg.training.batch_size;
  traced_ = traced_now();
  bool more = train_feed_->start([this] { return next_train_batch(); });
  for (int64_t first = 0; more; first += A) {
    const int64_t last = std::min(first + A, e.batches);
    traced_ = traced_now();
    StepInputs in;
    in.epoch = e.index;
    in.step_in_epoch = e.step_in_epoch + 1;
    in.global_step = sum_.steps + 1;
    in.micro_batches = last - first;
    in.rows = std::min(last * B, e.shard) - first * B;
    in.lr = schedule_.lr(sum_.steps);
    in.log = logged(in.global_step);
    in.traced = traced_;
    const std::optional<StepResult> read = pipeline_.step(*train_feed_, in);
    e.complete = last == e.batches;
    if (!after_step(e, in.rows, read)) return;
    more = train_feed_->advance();
  }
}

// Counts the step (`rows` samples of this rank) and reads the one the pipeline let go, if any;
// then stops at max_steps or an agreed stop request, or writes a checkpoint that is due. False:
// stop here.
bool TrainLoop::after_step(Epoch& e, int64_t rows, const std::optional<StepResult>& read) {
  ++e.step_in_epoch;
  ++sum_.steps;
  const TrainingConfig& t = p_.cfg.training;
  if (t.print_shapes && !shapes_printed_) {
    // The step's first micro-batch: a whole batch, or the epoch's one short batch.
    const int64_t first_rows = std::min(t.batch_size, rows);
    p_.report.print_shapes(first_rows, p_.data.train.features, p_.cfg.model.layers.back());
    shapes_printed_ = true;
  }
  const bool limit = t.max_steps > 0 && sum_.steps >= t.max_steps;
  // Every rank's shard has the same number of rows per step (the sampler pads or drops).
  e.position += rows * p_.comm.size();
  at_.epoch = e.index;
  at_.step_in_epoch = e.step_in_epoch;
  at_.epoch_position = e.position;
  at_.global_step = sum_.steps;
  at_.schedule_steps = schedule_.total_steps();
  note_scaler();
  if (read) read_step(*read);
  if (limit) {
    stop_ = true;
    return false;
  }
  if (StopPoll::due(sum_.steps) && stop_poll_.poll()) {
    sum_.interrupted = stop_ = true;
    return false;
  }
  if (p_.checkpoints.due_after_step(sum_.steps)) {
    if (e.complete) {
      e.checkpoint_due = true;  // written after the epoch's evaluation
    } else {
      read_all_steps();
      p_.checkpoints.save(at_, epoch_tally_);
    }
  }
  return true;
}

// Reads the epoch's last steps; on a stop request writes the checkpoint; otherwise reports
// the epoch (an epoch cut short by max_steps only in the summary), evaluates, checkpoints.
// False: training ends with this epoch.
bool TrainLoop::end_epoch(Epoch& e) {
  read_all_steps();
  be_.synchronize();  // the epoch's time includes the device finishing its work
  if (e.complete) {
    at_ = TrainingState{};
    at_.epoch = e.index + 1;
    at_.global_step = sum_.steps;
    at_.skipped_steps = sum_.skipped_steps;
    at_.scaler_skipped_steps = sum_.scaler_skipped_steps;
    at_.schedule_steps = schedule_.total_steps();
    note_scaler();
  }
  if (sum_.interrupted) {
    // Preempted: the checkpoint first (the grace period is short), no evaluation.
    p_.report.say("stop requested (SIGTERM/SIGINT/SIGUSR1): writing a checkpoint at epoch " +
                  std::to_string(at_.epoch + 1) + " step " + std::to_string(at_.step_in_epoch));
    p_.checkpoints.save(at_, e.complete ? Tally{} : epoch_tally_);
    return false;
  }
  const double seconds = seconds_now() - e.start_time;
  train_seconds_ += seconds;
  sum_.epochs = e.index + 1;
  const Tally train = epoch_tally_.reduced(p_.comm);
  const double trained = train.count - e.restored_count;
  sum_.samples += static_cast<int64_t>(trained);
  sum_.train_loss = train.loss();
  sum_.train_accuracy = train.accuracy();
  if (!e.complete) return false;  // stopped by max_steps inside the epoch
  report_epoch(e, train, seconds, trained);
  if (e.checkpoint_due || p_.checkpoints.due_after_epoch(e.index + 1))
    p_.checkpoints.save(at_, Tally{});
  return true;
}

// The epoch line and record, with the test split's loss and accuracy when there is one.
void TrainLoop::report_epoch(const Epoch& e, const Tally& train, double seconds, double trained) {
  const double rate = trained / std::max(1e-9, seconds);
  std::ostringstream line;
  line << "epoch " << e.index + 1 << "/" << p_.cfg.training.epochs << " done in " << std::fixed
       << std::setprecision(seconds < 1 ? 4 : 2) << seconds << " s: train loss "
       << std::setprecision(4) << train.loss() << " acc " << percent(train.accuracy()) << ", "
       << format_rate(rate);
  nlohmann::json record = {{"type", "epoch"},
                           {"epoch", e.index + 1},
                           {"global_step", sum_.steps},
                           {"train_loss", train.loss()},
                           {"train_accuracy", train.accuracy()},
                           {"seconds", seconds},
                           {"samples_per_sec", rate}};
  if (pipeline_.scaler().enabled()) {
    line << ", loss scale " << std::defaultfloat << std::setprecision(9) << sum_.loss_scale << " ("
         << sum_.scaler_skipped_steps << " step(s) skipped on overflow)";
    record["loss_scale"] = sum_.loss_scale;
    record["scaler_skipped_steps"] = sum_.scaler_skipped_steps;
  }
  if (p_.data.has_test) {
    const Tally t = evaluate();
    sum_.evaluated = true;
    sum_.test_loss = t.loss();
    sum_.test_accuracy = t.accuracy();
    line << " | test loss " << std::setprecision(4) << t.loss() << " acc " << percent(t.accuracy());
    p_.report.record({{"type", "eval"},
                      {"epoch", e.index + 1},
                      {"global_step", sum_.steps},
                      {"loss", t.loss()},
                      {"accuracy", t.accuracy()},
                      {"samples", t.count}});
  }
  p_.report.say(line.str());
  p_.report.record(record);
}

// Collective: loss and accuracy over the test split, each rank on its shard.
Tally TrainLoop::evaluate() {
  Tally t;
  const Dataset& test = p_.data.test;
  Loader& loader = *p_.data.test_loader;
  loader.start_epoch(shard_indices(test.size, p_.comm.size(), p_.comm.rank()));
  bool more = test_feed_->start([&loader] { return loader.next(); });
  for (; more; more = test_feed_->advance()) {
    const DeviceBatch batch = test_feed_->take();
    const Tensor& logits = p_.replica.model().forward(be_, batch.x);
    t.add(be_.softmax_xent(logits, batch.labels, 0.0f, nullptr), batch.rows);
  }
  return t.reduced(p_.comm);
}

// The checkpoint a periodic run ends with, the summary line and record, the timeline.
TrainSummary TrainLoop::finish() {
  if (!sum_.interrupted && p_.checkpoints.due_at_end(sum_.steps, first_step_))
    p_.checkpoints.save(at_, at_.step_in_epoch == 0 ? Tally{} : epoch_tally_);
  p_.checkpoints.settle();  // the last checkpoint is durable before the run reports its end
  sum_.last_checkpoint = p_.checkpoints.last();
  sum_.stop_signal = stop_requested();
  sum_.seconds = train_seconds_;
  sum_.samples_per_sec = sum_.samples / std::max(1e-9, train_seconds_);
  sum_.data_wait_seconds = p_.data.train_loader->wait_seconds();
  // Overlap as the whole job saw it: ranks' allreduce and hidden time summed.
  double comm_totals[2] = {sum_.comm_seconds, sum_.hidden_seconds};
  p_.comm.allreduce(comm_totals, 2, ReduceOp::Sum);
  const double overlap = comm_totals[0] > 0 ? comm_totals[1] / comm_totals[0] : 1.0;
  note_stragglers_and_mfu();
  const std::string device = p_.ctx.placement().describe();
  p_.report.summary(sum_, overlap, device);
  p_.report.write_trace(device);
  stop_poll_.finish();  // the last stop flag's collective, before teardown
  if (sum_.interrupted)
    p_.report.say("resume with --resume auto (or --resume " + sum_.last_checkpoint + ")");
  return sum_;
}

// A read step: its times and skip counted, its loss (when finite) in the tallies and, at the end
// of a logging interval, a progress line.
void TrainLoop::read_step(const StepResult& r) {
  sum_.wait_seconds += r.wait_seconds;
  log_waits_.add(r.wait_timed, r.collective_wait);
  sum_.comm_seconds += r.comm_seconds;
  sum_.hidden_seconds += r.hidden_seconds;
  sum_.graph_steps += r.graphed ? 1 : 0;
  if (r.scaler_skipped) {
    at_.scaler_skipped_steps = ++sum_.scaler_skipped_steps;
  } else if (r.skipped) {
    at_.skipped_steps = ++sum_.skipped_steps;
  }
  if (std::isfinite(r.totals.loss_sum)) {
    // The job's totals, the same on every rank, count on rank 0 alone (its rows still count
    // everywhere), so the ranks' tallies add up to them exactly.
    const XentResult counted = r.job_totals && p_.comm.rank() != 0 ? XentResult{} : r.totals;
    epoch_tally_.add(counted, r.rows);
    log_tally_.add(counted, r.rows);
  }
  if (r.log) progress_line(r);
}

// The loss scale and its tracker after the last queued step (decided as it was queued), for
// checkpoints and the summary; 0 without loss scaling.
void TrainLoop::note_scaler() {
  const LossScaler& scaler = pipeline_.scaler();
  at_.loss_scale = sum_.loss_scale = scaler.enabled() ? scaler.scale() : 0.0;
  at_.loss_scale_growth_tracker = scaler.growth_tracker();
}

// Every step still queued (at the end of an epoch, before a checkpoint).
void TrainLoop::read_all_steps() {
  for (const StepResult& r : pipeline_.drain()) read_step(r);
}

// Collective: loss, accuracy and samples/s over every rank since the last line.
void TrainLoop::progress_line(const StepResult& rec) {
  const double interval_end = seconds_now();
  std::optional<IntervalReport> ranks;
  if (straggler_threshold_ > 0) ranks = gather_rank_splits(interval_end);
  const Tally g = log_tally_.reduced(p_.comm);
  const double now = seconds_now();
  const double rate = g.count / std::max(1e-9, now - log_start_);
  std::ostringstream line;
  line << "epoch " << rec.epoch + 1 << "/" << p_.cfg.training.epochs << " step "
       << rec.step_in_epoch << "/" << steps_in_epoch_ << " loss " << std::fixed
       << std::setprecision(4) << g.loss() << " acc " << percent(g.accuracy()) << " lr "
       << std::scientific << std::setprecision(2) << rec.lr;
  if (rec.has_norm)
    line << " grad norm " << std::defaultfloat << std::setprecision(3) << rec.grad_norm;
  const bool scaling = pipeline_.scaler().enabled();
  if (scaling) line << " scale " << std::defaultfloat << std::setprecision(9) << rec.loss_scale;
  line << " " << format_rate(rate);
  if (ranks && ranks->skew >= straggler_threshold_)
    line << " | straggler: rank " << ranks->slowest << " " << std::fixed << std::setprecision(1)
         << ranks->skew << "x median";
  p_.report.say(line.str());
  nlohmann::json record = {{"type", "train"},           {"epoch", rec.epoch + 1},
                           {"step", rec.step_in_epoch}, {"global_step", rec.global_step},
                           {"loss", g.loss()},          {"accuracy", g.accuracy()},
                           {"samples", g.count},        {"samples_per_sec", rate},
                           {"time", now - run_start_},  {"lr", rec.lr}};
  if (rec.has_norm) record["grad_norm"] = rec.grad_norm;
  if (ranks) record["ranks"] = ranks_record(*ranks);
  if (scaling) {  // the scale the step ran with; the overflow skips so far
    record["loss_scale"] = rec.loss_scale;
    record["scaler_skipped_steps"] = sum_.scaler_skipped_steps;
  }
  p_.report.record(record);
  if (p_.report.tracer().enabled()) p_.report.tracer().counter("samples/s (all ranks)", now, rate);
  log_tally_ = Tally{};
  log_start_ = seconds_now();
  log_data_wait_start_ = p_.data.train_loader->wait_seconds();
  log_waits_.reset();
}

// Collective (one allgather of 3 doubles, on logged steps only): every rank's split of the
// interval since the last progress line, the wall time up to `interval_end` (before this line's
// collectives) being
// - data wait: the training thread blocked in Loader::next() for a batch not yet assembled;
// - collective wait: StepResult::collective_wait, the rank's wait for its peers' gradients after
//   its own backward: on the host the training thread blocked in Reducer::finalize(); on a GPU
//   the device, from the buckets' events (the host only queues that wait, and reading a step
//   waits for the slowest rank alike on every rank). Graph replays carry no times: the
//   interval's eager steps (the logged one at least) stand for them (WaitTally);
// - compute: the rest, the rank's own work (forward, backward, optimizer, the small
//   collectives of loss totals and stop polls, checkpoints written inside the interval).
// The slowest is the rank with the most compute + data wait: its peers reach the allreduce
// first and wait there, so theirs is the large collective wait and the slow rank's the small.
IntervalReport TrainLoop::gather_rank_splits(double interval_end) {
  const RankSplit mine = split_interval(interval_end - log_start_,
                                        p_.data.train_loader->wait_seconds() - log_data_wait_start_,
                                        log_waits_.estimate());
  const double sent[3] = {mine.compute, mine.data_wait, mine.collective_wait};
  std::vector<double> all(3 * static_cast<size_t>(p_.comm.size()));
  p_.comm.allgather(sent, 3, all.data());
  std::vector<RankSplit> splits(static_cast<size_t>(p_.comm.size()));
  for (size_t r = 0; r < splits.size(); ++r)
    splits[r] = {all[3 * r], all[3 * r + 1], all[3 * r + 2]};
  const IntervalReport report = report_interval(splits);
  stragglers_.add(report, straggler_threshold_);
  return report;
}

// The straggler verdict and the MFU in the summary. Collective: every rank measures or reads its
// peak (a CPU rank times its GEMMs here, after the timed training), and the job's is their mean
// (unknown when one rank's is).
void TrainLoop::note_stragglers_and_mfu() {
  sum_.straggler_threshold = straggler_threshold_;
  sum_.logged_intervals = stragglers_.logged();
  sum_.straggler_flagged = stragglers_.flagged();
  if (const std::optional<StragglerTally::Verdict> v = stragglers_.persistent()) {
    sum_.straggler_rank = v->rank;
    sum_.straggler_slowest_at = v->slowest_at;
    sum_.straggler_skew = v->mean_skew;
  }
  const DevicePlacement& place = p_.ctx.placement();
  const PeakFlops peak =
      rank_peak(p_.cfg.output.peak_tflops, be_, place.device == Device::CUDA ? place.gpu : -1,
                p_.cfg.training.precision);
  double lowest = peak.per_rank, total = peak.per_rank;
  p_.comm.allreduce(&lowest, 1, ReduceOp::Min);
  p_.comm.allreduce(&total, 1, ReduceOp::Sum);
  sum_.flops_per_sample = flops_per_sample(p_.cfg.model.layers);
  sum_.peak_flops = lowest > 0 ? total / p_.comm.size() : 0.0;
  sum_.peak_source = peak.source;
  sum_.mfu = model_flops_utilisation(sum_.flops_per_sample, sum_.samples_per_sec, sum_.peak_flops,
                                     p_.comm.size());
}

// A progress line ends the step: every training.log_every steps and at training.max_steps.
bool TrainLoop::logged(int64_t global_step) const {
  const TrainingConfig& t = p_.cfg.training;
  const bool limit = t.max_steps > 0 && global_step >= t.max_steps;
  return t.log_every > 0 && (global_step % t.log_every == 0 || limit);
}

bool TrainLoop::traced_now() const {
  const int64_t limit = p_.cfg.output.trace_steps;
  return p_.report.tracer().enabled() && (limit == 0 || sum_.steps - first_step_ < limit);
}

const Batch* TrainLoop::next_train_batch() {
  const double t0 = seconds_now();
  const Batch* b = p_.data.train_loader->next();
  if (traced_) p_.report.tracer().span(p_.report.data_track(), "next batch", t0, seconds_now());
  return b;
}

}  // namespace ddp
