// Checkpoints of a run (checkpoint_policy.h).
#include "train/checkpoint_policy.h"

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
  double megabytes = 0.0;
  auto optimizer_state = [this] {
    std::vector<OptimizerState> out;
    for (const std::string& name : replica_.optimizer().state_names())
      out.push_back({name, replica_.named(replica_.host_optimizer_state(name))});
    return out;
  };
  // A sharded optimizer's state is gathered from every rank first (a collective).
  std::vector<OptimizerState> gathered;
  if (replica_.sharded()) gathered = optimizer_state();
  run_agreed(comm_, [&] {
    if (comm_.rank() != 0) return;
    TrainingCheckpoint ck;
    ck.state = st;
    ck.weights = replica_.named(replica_.host_parameters());
    ck.optimizer = replica_.sharded() ? std::move(gathered) : optimizer_state();
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    DDP_CHECK(!ec, "checkpoint.dir: cannot create " << dir_ << ": " << ec.message());
    write_checkpoint(path, ck);
    megabytes = static_cast<double>(std::filesystem::file_size(path, ec)) / kMiB;
    prune_checkpoints(dir_, cfg_.checkpoint.keep_last, run_, path);
  });
  last_ = path;
  last_step_ = st.global_step;
  const double seconds = seconds_now() - t0;
  std::ostringstream line;
  line << "checkpoint: " << path << " (epoch " << st.epoch + 1 << " step " << st.step_in_epoch
       << ", " << std::fixed << std::setprecision(1) << megabytes << " MiB in "
       << std::setprecision(3) << seconds << " s)";
  report_.say(line.str());
  report_.record({{"type", "checkpoint"},
                  {"path", path},
                  {"epoch", st.epoch + 1},
                  {"step", st.step_in_epoch},
                  {"global_step", st.global_step},
                  {"seconds", seconds}});
}

}  // namespace ddp
