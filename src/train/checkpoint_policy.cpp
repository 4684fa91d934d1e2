// Checkpoints of a run (checkpoint_policy.h).
#include "train/checkpoint_policy.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <iomanip>
#include <sstream>
#include <utility>
#include <vector>

#include "config/fingerprint.h"
#include "core/check.h"
#include "core/clock.h"
#include "comm/agreement.h"

namespace ddp {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;

// The calling thread yields its core to training: on a machine whose cores the ranks fill, the
// writer then takes the cycles they leave (nice 10; Linux sets it per thread).
void lower_thread_priority() {
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
}

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}
}  // namespace

CheckpointPolicy::CheckpointPolicy(const TrainConfig& cfg, ProcessGroup& comm, DeviceContext& ctx,
                                   Replica& replica, Reporter& report, int64_t train_samples)
    : cfg_(cfg),
      comm_(comm),
      ctx_(ctx),
      replica_(replica),
      report_(report),
      train_samples_(train_samples),
      dir_(cfg.checkpoint.directory(cfg.output.dir)) {}

bool CheckpointPolicy::due_after_step(int64_t global_step) const {
  const int64_t every = cfg_.checkpoint.every_steps;
  return every > 0 && global_step % every == 0;
}

bool CheckpointPolicy::due_after_epoch(int64_t epochs_done) const {
  const int64_t every = cfg_.checkpoint.every_epochs;
  return every > 0 && epochs_done % every == 0;
}

bool CheckpointPolicy::due_at_end(int64_t global_step, int64_t first_step) const {
  return cfg_.checkpoint.periodic() && last_step_ != global_step && global_step > first_step;
}

void CheckpointPolicy::save(TrainingState st, const Tally& epoch_tally) {
  settle();  // one checkpoint in flight at a time
  const Tally g = epoch_tally.reduced(comm_);
  st.epoch_loss_sum = g.loss_sum;
  st.epoch_correct = g.correct;
  st.epoch_count = g.count;
  st.optimizer_steps = replica_.optimizer().steps_taken();
  st.world_size = comm_.size();
  st.global_batch = cfg_.global_batch(comm_.size());
  st.train_samples = train_samples_;
  st.config = resume_fingerprint(cfg_);
  st.run = run_;
  const std::string path = checkpoint_path(dir_, st.global_step);
  const double t0 = seconds_now();
  ctx_.backend().synchronize();  // the last step's update has landed
  // A sharded optimizer's state is gathered from every rank first (a collective).
  if (replica_.sharded()) copy_optimizer_state();
  save_powersgd_state(comm_, replica_, snapshot_.powersgd);  // gathered to rank 0
  const bool async = cfg_.checkpoint.async;
  Written written;
  run_agreed(comm_, [&] {
    if (comm_.rank() != 0) return;
    // A copy: training may change the replica's state from here.
    snapshot_.state = st;
    replica_.host_parameters(staging_);
    replica_.named(staging_, snapshot_.weights);
    if (!replica_.sharded()) copy_optimizer_state();
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    DDP_CHECK(!ec, "checkpoint.dir: cannot create " << dir_ << ": " << ec.message());
    if (!async) {
      written = write(path);
      return;
    }
    writing_ = std::async(std::launch::async, [this, path] {
      lower_thread_priority();
      return write(path);
    });
  });
  last_step_ = st.global_step;
  const double blocked = seconds_now() - t0;
  if (async) {
    in_flight_ = InFlight{st, path, blocked};  // reported once it is durable
    return;
  }
  last_ = path;
  report(st, path, written.megabytes, blocked, nullptr);
}

void CheckpointPolicy::settle() {
  if (!in_flight_) return;
  const InFlight done = std::move(*in_flight_);
  in_flight_.reset();
  const double t0 = seconds_now();
  Written written;
  run_agreed(comm_, [&] {
    if (comm_.rank() == 0) written = writing_.get();  // rethrows the writer's error
  });
  last_ = done.path;
  report(done.at, done.path, written.megabytes, done.blocked_seconds + seconds_now() - t0,
         &written);
}

// The optimizer's state arrays into the snapshot (rank 0); a sharded optimizer's are gathered
// from every rank, a collective.
void CheckpointPolicy::copy_optimizer_state() {
  const std::vector<std::string> names = replica_.optimizer().state_names();
  snapshot_.optimizer.resize(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    replica_.host_optimizer_state(names[i], staging_);
    if (comm_.rank() != 0) continue;
    snapshot_.optimizer[i].name = names[i];
    replica_.named(staging_, snapshot_.optimizer[i].tensors);
  }
}

CheckpointPolicy::Written CheckpointPolicy::write(const std::string& path) const {
  const double t0 = seconds_now();
  write_checkpoint(path, snapshot_);
  std::error_code ec;
  Written w;
  w.megabytes = static_cast<double>(std::filesystem::file_size(path, ec)) / kMiB;
  prune_checkpoints(dir_, cfg_.checkpoint.keep_last, run_, path);
  w.seconds = seconds_now() - t0;
  return w;
}

// `blocked_seconds`: the training thread's time in save and settle; `background`: the writer
// thread's, for a checkpoint written asynchronously.
void CheckpointPolicy::report(const TrainingState& at, const std::string& path, double megabytes,
                              double blocked_seconds, const Written* background) {
  std::ostringstream line;
  line << "checkpoint: " << path << " (epoch " << at.epoch + 1 << " step " << at.step_in_epoch
       << ", " << std::fixed << std::setprecision(1) << megabytes << " MiB in "
       << std::setprecision(3) << (background ? background->seconds : blocked_seconds) << " s"
       << (background ? " in the background, " + fixed(blocked_seconds, 3) + " s of training"
                      : std::string())
       << ")";
  report_.say(line.str());
  nlohmann::json record = {{"type", "checkpoint"},
                           {"path", path},
                           {"epoch", at.epoch + 1},
                           {"step", at.step_in_epoch},
                           {"global_step", at.global_step},
                           {"seconds", blocked_seconds}};
  if (background) record["write_seconds"] = background->seconds;
  report_.record(record);
}

}  // namespace ddp
