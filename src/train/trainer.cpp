// The Trainer (include/ddp/trainer.h): sets a run up — this rank's device, its data, its
// replica of the model (checked against rank 0's), the checkpoint policy, a resumed position —
// then hands it to the epoch loop (train_loop.h) and saves the final weights.
#include "ddp/trainer.h"

#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "comm/agreement.h"
#include "comm/environment.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/powersgd_communicator.h"
#include "config/fingerprint.h"
#include "core/check.h"
#include "io/training_checkpoint.h"
#include "train/checkpoint_policy.h"
#include "train/device_context.h"
#include "train/flight_log.h"
#include "train/replica.h"
#include "train/report.h"
#include "train/resume.h"
#include "train/run_directory.h"
#include "train/train_loop.h"
#include "train/training_data.h"
#include "train/tuner.h"

namespace ddp {

namespace {

// What every rank must share before any collective whose size depends on the model: the
// config (but where rank 0 writes), the parameters' shapes, the bucket plan, the world size.
std::vector<std::string> startup_fingerprint(const TrainConfig& cfg, const Replica& replica,
                                             int world) {
  std::vector<std::string> lines = shared_config_lines(cfg);
  for (const auto& [name, shape] : replica.shapes())
    lines.push_back("parameter " + name + " " + shape_string(shape));
  std::istringstream plan(describe_plan(replica.plan(), replica.parameter_names()));
  for (std::string line; std::getline(plan, line);) lines.push_back(line);
  lines.push_back("world size " + std::to_string(world));
  return lines;
}

// model.safetensors' metadata: PyTorch's format tag and the input transform training used.
std::map<std::string, std::string> model_metadata(const TrainingData& data) {
  std::map<std::string, std::string> metadata = normalization_metadata(data.transform);
  metadata["format"] = "pt";
  return metadata;
}

}  // namespace

struct Trainer::State {
  TrainConfig cfg;
  MpiCommunicator& comm;
  Reporter report;
  // Before the replica: its communicators number their collectives in it until they go.
  std::shared_ptr<FlightRecorder> flight_recorder;  // null: output.flight_recorder is 0
  std::unique_ptr<DeviceContext> ctx;
  GradientPath path;
  TrainingData data;
  std::unique_ptr<Replica> replica;  // after ctx: its buffers live on ctx's device
  RunDirectory run_dir;              // rank 0: output.dir's lock, held for the run's life
  std::unique_ptr<CheckpointPolicy> checkpoints;
  std::unique_ptr<FlightLog> flight;  // once output.dir is this run's

  TrainingState start;
  bool resumed = false;
  std::string data_line;  // where the data lives (TrainingData::share)
  std::vector<std::string> tune_lines;  // distributed.tune: auto's measurements and choice

  State(const TrainConfig& c, MpiCommunicator& cm, std::ostream* log)
      : cfg(c), comm(cm), report(cfg, cm, log) {}
  void setup();
  void tune(const RankLayout& layout);
  void start_flight_recorder();
  void start_flight_log();
  void describe_run();
  std::string describe_optimizer_state() const;
};

// Collective; every failure ends every rank with one message (run_agreed).
void Trainer::State::setup() {
  comm.set_timeout(cfg.distributed.timeout_s);
  start_flight_recorder();
  run_agreed(comm, [&] {
    ctx = make_device_context(place_rank(cfg, comm));
    data.read(cfg, comm);
  });
  data_line = data.share(cfg, comm);  // collective: one copy of the data per node
  const RankLayout layout = rank_layout(comm);
  if (cfg.distributed.tune == Tune::Auto) tune(layout);
  run_agreed(comm, [&] {
    path = resolve_gradient_path(cfg, ctx->device(), ctx->placement().backend, layout);
    data.prepare(cfg, comm.size(), comm.rank());
    replica = std::make_unique<Replica>(cfg, path, *ctx, data.max_batch(cfg), comm.size());
    if (comm.rank() == 0) run_dir.claim(cfg);
    report.open_outputs();
  });
  start_flight_log();
  for (const std::string& note : run_dir.notes()) report.say(note);
  report.say_each_rank("  rank " + std::to_string(comm.rank()) + ": " + ctx->describe());
  // Compare before any collective whose size depends on the data or the model, so a mismatch
  // is a message and not a truncated broadcast, a hang or ranks that sample different sets.
  run_agreed(comm, [&] {
    require_same_as_rank0(comm, startup_fingerprint(cfg, *replica, comm.size()),
                          "model or configuration",
                          "every rank must run the same config and model");
  });
  // The same config may still read other files on another node.
  run_agreed(comm, [&] {
    require_same_as_rank0(comm, data.fingerprint(), "data",
                          "every rank must read the same files (on every node)");
  });
  replica->connect(comm, comm, cfg);
  replica->set_flight_recorder(flight_recorder.get());
  checkpoints =
      std::make_unique<CheckpointPolicy>(cfg, comm, *ctx, *replica, report, data.train.size);
  data.start(cfg, comm.size(), comm.rank(), loader_workers(cfg, ctx->device(), comm.local_size()));
  resumed =
      resume_training(cfg, comm, *replica, report, checkpoints->dir(), data.train.size, start);
  // The checkpoints this run prunes: those of the run it continues, or of a new one.
  const bool named = resumed && !start.run.empty();
  checkpoints->set_run(broadcast_string(comm, named ? start.run : new_run_name(), 0));
  describe_run();
  report.start_trace(*ctx);
}

// distributed.tune: auto. The config's own path must resolve first (a GPU refuses the tuner
// by name); the choice replaces the config, so config.yaml records it.
void Trainer::State::tune(const RankLayout& layout) {
  run_agreed(comm, [&] {
    resolve_gradient_path(cfg, ctx->device(), ctx->placement().backend, layout);
  });
  TuneOutcome outcome;
  run_agreed(comm, [&] {
    outcome = tune_gradient_path(cfg, comm, layout, ctx->arena_alignment());
  });
  cfg = outcome.cfg;
  tune_lines = outcome.lines;
}

// Every collective from here on is numbered and kept (the setup's too: a rank stopped there is
// named like one stopped in a step).
void Trainer::State::start_flight_recorder() {
  if (cfg.output.flight_recorder == 0) return;
  flight_recorder =
      std::make_shared<FlightRecorder>(static_cast<size_t>(cfg.output.flight_recorder));
  comm.set_flight_recorder(flight_recorder);
}

// Collective. Once every rank knows output.dir is this run's (rank 0 claimed it): before, a
// record could land in another job's folder. The job's id tells its records from an earlier
// job's in the same folder.
void Trainer::State::start_flight_log() {
  const std::string job = broadcast_string(comm, new_run_name(), 0);
  if (!flight_recorder) return;
  flight = std::make_unique<FlightLog>(
      flight_recorder, FlightLog::Identity{cfg.output.dir, job, comm.rank(), comm.size(),
                                           cfg.distributed.timeout_s});
}

void Trainer::State::describe_run() {
  const BucketPlan& plan = replica->plan();
  report.say("model: " + replica->model().describe() + ", " + std::to_string(plan.total_numel) +
             " parameters in " + std::to_string(plan.buckets.size()) + " bucket(s)");
  std::istringstream plan_lines(describe_plan(plan, replica->model().parameter_names()));
  for (std::string line; std::getline(plan_lines, line);) report.say("  " + line);
  const int64_t b = cfg.training.batch_size;
  report.say("data: " + std::to_string(data.train.size) + " training samples (" +
             data.train.source + "), " + std::to_string(data.sampler->num_samples()) +
             " per rank per epoch; global batch " + std::to_string(cfg.global_batch(comm.size())) +
             " = " + std::to_string(b) + " per rank x " + std::to_string(comm.size()) +
             " ranks x " + std::to_string(cfg.training.accumulate_steps) + " accumulation step(s)");
  if (!data_line.empty()) report.say(data_line);
  if (cfg.data.normalize.mode != Normalization::Mode::None)
    report.say("data: features normalised (data.normalize: " +
               std::string(cfg.data.normalize.mode == Normalization::Mode::Standardize
                               ? "standardize, each feature by the training split's mean and std"
                               : "one mean and std for every feature") +
               ")");
  const std::string gradients = ctx->describe_gradients();
  if (!gradients.empty()) report.say(gradients);
  report.say(describe_optimizer_state());
  report.say(replica->precision_line());
  for (const std::string& line : tune_lines) report.say(line);
  for (const std::string& line : path.description) report.say(line);
  if (const PowerSgdCommunicator* powersgd = replica->powersgd()) {
    const size_t sent = powersgd->sent_floats(), whole = powersgd->whole_floats();
    std::ostringstream line;
    line << "gradients: PowerSGD sends " << sent << " of " << whole << " floats a step per rank ("
         << std::fixed << std::setprecision(2) << 100.0 * static_cast<double>(sent) / whole
         << "%), in two sums a bucket";
    report.say(line.str());
  }
}

// "optimizer: adamw, state exp_avg exp_avg_sq: 2 x 101,776 floats (0.8 MiB) on rank 0, its
// shard of 203,530 (distributed.shard_optimizer)".
std::string Trainer::State::describe_optimizer_state() const {
  const Optimizer& opt = replica->optimizer();
  const std::vector<std::string> names = opt.state_names();
  std::ostringstream line;
  line << "optimizer: " << to_string(cfg.optimizer.name) << ", ";
  if (names.empty()) return line.str() + "no state";
  line << "state";
  for (const std::string& n : names) line << ' ' << n;
  const double mib =
      static_cast<double>(names.size() * opt.state_numel() * sizeof(float)) / (1024.0 * 1024.0);
  line << ": " << names.size() << " x " << opt.state_numel() << " floats (" << std::fixed
       << std::setprecision(1) << mib << " MiB) ";
  if (!replica->sharded()) return line.str() + "on every rank";
  line << "on rank 0, its shard of " << replica->plan().total_numel
       << " (distributed.shard_optimizer)";
  return line.str();
}

Trainer::Trainer(const TrainConfig& cfg, MpiCommunicator& comm, std::ostream* log)
    : s_(std::make_unique<State>(cfg, comm, log)) {
  try {
    s_->setup();
  } catch (const std::exception& e) {
    if (s_->flight) s_->flight->on_failure(e.what());
    throw;
  }
}

Trainer::~Trainer() = default;

std::vector<NamedTensor> Trainer::weights() const {
  return s_->replica->named(s_->replica->host_parameters());
}

TrainSummary Trainer::run() {
  try {
    return train_and_save();
  } catch (const std::exception& e) {
    if (s_->flight) s_->flight->on_failure(e.what());
    throw;
  }
}

TrainSummary Trainer::train_and_save() {
  State& s = *s_;
  const RunParts parts{s.cfg, s.comm, *s.ctx, s.data, *s.replica, s.report, *s.checkpoints};
  const TrainSummary sum = TrainLoop(parts, s.start, s.resumed).run();
  if (s.flight && s.cfg.output.flight_record_at_exit) {
    const std::string path = s.flight->write("exit", "");
    if (!path.empty()) s.report.say("flight records: " + s.cfg.output.dir + "/flight");
  }
  if (sum.interrupted) return sum;
  const bool save = s.cfg.output.save_model;
  run_agreed(s.comm, [&] {
    const std::vector<NamedTensor> w = weights();
    if (s.comm.rank() == 0 && save)
      save_safetensors(RunFiles::in(s.cfg, RunFiles::kModel), w, model_metadata(s.data));
  });
  if (save) s.report.say("weights: " + RunFiles::in(s.cfg, RunFiles::kModel));
  return sum;
}

}  // namespace ddp
