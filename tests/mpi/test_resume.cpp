// Checkpoints under mpiexec: a run stopped at any step boundary (max_steps, a stop request on one
// rank) and resumed ends with bitwise the weights of the run that was never stopped; a resume
// on another world size continues the epoch; mismatched checkpoints are refused on every rank;
// non-finite gradients stop the job or skip the step (training.nan_policy).
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <utility>

#include "comm/agreement.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"
#include "ddp/trainer.h"
#include "io/training_checkpoint.h"
#include "mpi_test_helpers.h"
#include "nn/lr_schedule.h"
#include "train/stop_request.h"

namespace {

using ddp_test::bitwise_equal;
using ddp_test::max_abs_diff;
using ddp_test::require_identical_replicas;
using ddp_test::train;
using ddp_test::world_size;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::string shared_scratch(const std::string& name) {
  return ddp_test::shared_scratch_dir("ddp_resume_", name);
}

// 190 samples: not a multiple of any N*B used here, so the last batch of an epoch is padded or
// partial and a resumed epoch must reproduce that too.
ddp::TrainConfig resume_config(const std::string& name) {
  ddp::TrainConfig cfg = ddp_test::small_training_config(shared_scratch(name));
  cfg.data.train.samples = 190;
  cfg.data.seed = 11;
  cfg.training.seed = 5;
  cfg.training.batch_size = 7;
  cfg.training.accumulate_steps = 2;
  cfg.training.epochs = 3;
  return cfg;
}

// Optimizer steps in an epoch of `cfg` on this world size.
int64_t steps_per_epoch(const ddp::TrainConfig& cfg) {
  const int64_t n = world_size(), b = cfg.training.batch_size, a = cfg.training.accumulate_steps;
  const int64_t shard = (cfg.data.train.samples + n - 1) / n;
  return ((shard + b - 1) / b + a - 1) / a;
}

// Trains `cfg` for `stop_at` steps (checkpointed at the end, in scratch dir `part`), resumes it
// to the end, and requires bitwise the weights of the uninterrupted run (`whole`, `steps`).
void require_resumes_bitwise(const ddp::TrainConfig& cfg, const std::string& part, int64_t stop_at,
                             const std::vector<ddp::NamedTensor>& whole, int64_t steps) {
  ddp::TrainConfig first = cfg;
  first.output.dir = shared_scratch(part);
  first.training.max_steps = stop_at;
  first.checkpoint.every_steps = 1000;  // periodic: the last step is checkpointed at the end
  ddp::TrainSummary first_summary;
  train(first, MPI_COMM_WORLD, &first_summary);
  REQUIRE(first_summary.steps == stop_at);
  REQUIRE_FALSE(first_summary.last_checkpoint.empty());

  ddp::TrainConfig rest = first;
  rest.training.max_steps = 0;
  rest.training.resume = "auto";
  ddp::TrainSummary rest_summary;
  const auto resumed = train(rest, MPI_COMM_WORLD, &rest_summary);
  CHECK(rest_summary.resumed);
  CHECK(rest_summary.steps == steps);
  require_identical_replicas(resumed);
  REQUIRE(bitwise_equal(resumed, whole));
}

}  // namespace

TEST_CASE("stopped at any step and resumed: bitwise the uninterrupted run's weights",
          "[mpi][resume]") {
  for (bool drop_last : {false, true}) {
    ddp::TrainConfig cfg = resume_config(drop_last ? "whole_drop" : "whole");
    cfg.data.drop_last = drop_last;
    ddp::TrainSummary whole_summary;
    const auto whole = train(cfg, MPI_COMM_WORLD, &whole_summary);
    const int64_t per_epoch = whole_summary.steps / cfg.training.epochs;
    REQUIRE(per_epoch >= 2);
    // Inside the first epoch, exactly at its end, and inside the last one.
    for (int64_t stop_at : {int64_t{1}, per_epoch, 2 * per_epoch + 1}) {
      INFO("drop_last " << drop_last << ", stopped after step " << stop_at << " of "
                        << whole_summary.steps);
      require_resumes_bitwise(cfg, "part" + std::to_string(stop_at) + (drop_last ? "d" : ""),
                              stop_at, whole, whole_summary.steps);
    }
  }
}

TEST_CASE("bf16 stopped and resumed: bitwise the uninterrupted run", "[mpi][resume][bf16]") {
  ddp::TrainConfig cfg = ddp_test::with_adam(resume_config("bf16_whole"), true, false);
  cfg.training.precision = ddp::Precision::Bf16;
  ddp::TrainSummary whole_summary;
  const auto whole = train(cfg, MPI_COMM_WORLD, &whole_summary);
  const int64_t per_epoch = whole_summary.steps / cfg.training.epochs;
  require_resumes_bitwise(cfg, "bf16_part", per_epoch + 1, whole, whole_summary.steps);
  // The checkpoint holds float32 truth only: a bf16 run's checkpoint resumes in fp32 too.
  ddp::TrainConfig fp32 = cfg;
  fp32.training.precision = ddp::Precision::Fp32;
  fp32.output.dir = shared_scratch("bf16_part");
  fp32.training.resume = "auto";
  fp32.training.max_steps = 0;
  ddp::TrainSummary fp32_summary;
  train(fp32, MPI_COMM_WORLD, &fp32_summary);
  CHECK(fp32_summary.resumed);
  CHECK(fp32_summary.steps == whole_summary.steps);
}

TEST_CASE("Adam and AdamW (AMSGrad) stopped and resumed: bitwise the uninterrupted run",
          "[mpi][resume][adam]") {
  for (const auto& [decoupled, amsgrad] : {std::pair{false, false}, std::pair{true, true}}) {
    const std::string name = decoupled ? "adamw" : "adam";
    ddp::TrainConfig cfg = ddp_test::with_adam(resume_config(name + "_whole"), decoupled, amsgrad);
    ddp::TrainSummary whole_summary;
    const auto whole = train(cfg, MPI_COMM_WORLD, &whole_summary);
    // The first update (bias correction's largest step) and one inside the second epoch.
    const int64_t per_epoch = whole_summary.steps / cfg.training.epochs;
    for (int64_t stop_at : {int64_t{1}, per_epoch + 2}) {
      INFO(name << (amsgrad ? ", amsgrad" : "") << ", stopped after step " << stop_at);
      require_resumes_bitwise(cfg, name + "_part" + std::to_string(stop_at), stop_at, whole,
                              whole_summary.steps);
    }
  }
}

TEST_CASE(
    "a schedule with clipping stopped mid-warmup and mid-decay: bitwise the uninterrupted run",
    "[mpi][resume][schedule]") {
  using ddp::SchedulerName;
  for (const SchedulerName schedule : {SchedulerName::Cosine, SchedulerName::Step}) {
    const bool cosine = schedule == SchedulerName::Cosine;
    const std::string name = cosine ? "adamw_cosine" : "sgd_step";
    ddp::TrainConfig cfg = resume_config(name + "_whole");
    if (cosine) cfg = ddp_test::with_adam(cfg, true, false);
    cfg = ddp_test::with_schedule(cfg, schedule);
    // The parts stop at training.max_steps, which would end a default-length schedule there.
    cfg.scheduler.total_steps = cosine ? 3 * steps_per_epoch(cfg) : 0;
    ddp::TrainSummary whole_summary;
    const auto whole = train(cfg, MPI_COMM_WORLD, &whole_summary);
    const int64_t per_epoch = whole_summary.steps / cfg.training.epochs;
    REQUIRE(per_epoch == steps_per_epoch(cfg));
    REQUIRE(per_epoch + 2 > cfg.scheduler.warmup_steps);
    // Inside the warmup (4 steps) and inside the decay, in the second epoch.
    for (int64_t stop_at : {int64_t{2}, per_epoch + 2}) {
      INFO(name << ", stopped after step " << stop_at);
      require_resumes_bitwise(cfg, name + "_part" + std::to_string(stop_at), stop_at, whole,
                              whole_summary.steps);
    }
  }
}

TEST_CASE("a resumed run keeps the schedule of the run it continues, though epochs change",
          "[mpi][resume][schedule]") {
  ddp::TrainConfig cfg =
      ddp_test::with_schedule(resume_config("keep_schedule"), ddp::SchedulerName::Cosine);
  cfg.training.epochs = 6;  // more steps than 2 x kStopPollSteps at 4 ranks too
  cfg.training.log_every = 1;
  const int64_t original_steps = 6 * steps_per_epoch(cfg);
  REQUIRE(original_steps > 2 * ddp::kStopPollSteps);
  // Stopped as a preempted job is (the schedule's length is the whole run's), resumed longer.
  if (world_rank() == world_size() - 1) ddp::request_stop(SIGTERM);
  ddp::TrainSummary first_summary;
  train(cfg, MPI_COMM_WORLD, &first_summary);
  ddp::clear_stop_request();
  REQUIRE(first_summary.interrupted);
  ddp::TrainConfig rest = cfg;
  rest.training.epochs = 8;
  rest.training.resume = "auto";
  ddp::TrainSummary rest_summary;
  train(rest, MPI_COMM_WORLD, &rest_summary);
  REQUIRE(rest_summary.steps == 8 * steps_per_epoch(cfg));

  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  long errors = 0;
  if (world_rank() == 0) {
    const ddp::TrainingCheckpoint ck = ddp::read_checkpoint(first_summary.last_checkpoint);
    CHECK(ck.state.schedule_steps == original_steps);
    errors += ck.state.schedule_steps != original_steps;
    const ddp::LrSchedule schedule(cfg.scheduler, cfg.optimizer.lr, original_steps);
    int64_t checked = 0, at_min = 0;
    std::ifstream metrics(cfg.output.dir + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const auto record = nlohmann::json::parse(line);
      if (record["type"] != "train") continue;
      const int64_t step = record["global_step"];
      const double lr = record["lr"];
      CHECK(lr == schedule.lr(step - 1));
      errors += lr != schedule.lr(step - 1);
      at_min += step > original_steps && lr == cfg.scheduler.min_lr;
      ++checked;
    }
    CHECK(checked == rest_summary.steps);
    CHECK(at_min == rest_summary.steps - original_steps);
    errors += checked != rest_summary.steps || at_min != rest_summary.steps - original_steps;
  }
  ddp_test::require_on_all_ranks(*comm, errors, "the resumed run's lr per step");
}

TEST_CASE("every_epochs: a checkpoint per epoch, keep_last prunes, an older one resumes exactly",
          "[mpi][resume]") {
  ddp::TrainConfig cfg = resume_config("epochs");
  cfg.checkpoint.every_epochs = 1;
  cfg.checkpoint.keep_last = 2;
  ddp::TrainSummary summary;
  const auto whole = train(cfg, MPI_COMM_WORLD, &summary);
  const int64_t per_epoch = summary.steps / cfg.training.epochs;
  std::string second_epoch;  // the older of the two kept: after epoch 2
  long errors = 0;
  if (world_rank() == 0) {
    const auto kept = ddp::list_checkpoints(cfg.output.dir + "/checkpoints");
    errors += kept.size() != 2;
    if (kept.size() == 2) {
      errors += kept[0].first != 2 * per_epoch || kept[1].first != 3 * per_epoch;
      const ddp::TrainingCheckpoint ck = ddp::read_checkpoint(kept[0].second);
      errors += ck.state.epoch != 2 || ck.state.step_in_epoch != 0 || ck.state.epoch_position != 0;
      second_epoch = kept[0].second;
    }
  }
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  ddp_test::require_on_all_ranks(*comm, errors, "checkpoints kept after 3 epochs");
  ddp::TrainConfig rest = cfg;
  rest.output.dir = shared_scratch("epochs_rest");
  rest.training.resume = ddp::broadcast_string(*comm, second_epoch, 0);  // rank 0's path
  ddp::TrainSummary rest_summary;
  REQUIRE(bitwise_equal(train(rest, MPI_COMM_WORLD, &rest_summary), whole));
  CHECK(rest_summary.steps == summary.steps);
}

TEST_CASE("a stop request on one rank stops every rank at the same step with a checkpoint",
          "[mpi][resume]") {
  ddp::TrainConfig cfg = resume_config("signal_whole");
  cfg.training.epochs = 6;  // more steps than 2 x kStopPollSteps at 4 ranks too
  const auto whole = train(cfg, MPI_COMM_WORLD);
  ddp::TrainConfig first = cfg;
  first.output.dir = shared_scratch("signal");
  if (world_rank() == world_size() - 1) ddp::request_stop(SIGTERM);  // as the handler would
  ddp::TrainSummary first_summary;
  train(first, MPI_COMM_WORLD, &first_summary);
  ddp::clear_stop_request();
  // Flags are sent every kStopPollSteps steps and read at the next poll: a request before step 1
  // stops every rank after step 2 x kStopPollSteps.
  CHECK(first_summary.interrupted);
  CHECK(first_summary.steps == 2 * ddp::kStopPollSteps);
  REQUIRE(ddp_test::max_over_ranks(*ddp::make_mpi_communicator(MPI_COMM_WORLD),
                                   first_summary.interrupted ? 0.0 : 1.0) == 0.0);
  if (world_rank() == 0) {
    REQUIRE(first_summary.last_checkpoint ==
            ddp::checkpoint_path(first.output.dir + "/checkpoints", 2 * ddp::kStopPollSteps));
    const ddp::TrainingCheckpoint ck = ddp::read_checkpoint(first_summary.last_checkpoint);
    CHECK(ck.state.global_step == 2 * ddp::kStopPollSteps);
    CHECK(ck.state.epoch_position == ck.state.step_in_epoch * 7 * 2 * world_size());
    CHECK(ck.state.world_size == world_size());
  }
  ddp::TrainConfig rest = first;
  rest.training.resume = "auto";
  REQUIRE(bitwise_equal(train(rest, MPI_COMM_WORLD), whole));
}

TEST_CASE("a checkpoint resumed on one rank continues the epoch as the global batch says",
          "[mpi][resume]") {
  const int n = world_size();
  if (n < 2) return;
  ddp::TrainConfig cfg = resume_config("world_whole");
  cfg.data.train.samples = 7 * 2 * n * 9;  // no padding: N ranks x B equals 1 rank x N*B
  const auto whole = train(cfg, MPI_COMM_WORLD);
  ddp::TrainConfig first = cfg;
  first.output.dir = shared_scratch("world");
  first.training.max_steps = 4;
  first.checkpoint.every_steps = 4;
  train(first, MPI_COMM_WORLD);
  // Rank 0 alone continues with the same global batch; the others wait for it.
  MPI_Comm alone = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &alone);
  std::vector<ddp::NamedTensor> resumed;
  if (alone != MPI_COMM_NULL) {
    ddp::TrainConfig rest = first;
    rest.training.max_steps = 0;
    rest.training.resume = "auto";
    rest.training.batch_size = cfg.training.batch_size * n;
    ddp::TrainSummary summary;
    resumed = train(rest, alone, &summary);
    CHECK(summary.steps == 3 * 9);
    MPI_Comm_free(&alone);
  }
  // Every rank compares rank 0's result (the others take its structure from `whole`).
  if (world_rank() != 0) resumed = whole;
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  for (auto& t : resumed) comm->broadcast(t.data.data(), t.data.size() * sizeof(float), 0);
  const double diff = max_abs_diff(resumed, whole);
  INFO("max |resumed on 1 rank - uninterrupted on " << n << "| = " << diff);
  REQUIRE(diff <= 1e-5);
  REQUIRE(diff > 0.0);  // a different reduction order: equal values would be suspicious
}

TEST_CASE("a mismatched checkpoint is refused on every rank naming the difference",
          "[mpi][resume]") {
  ddp::TrainConfig cfg = resume_config("mismatch");
  cfg.training.max_steps = 2;
  cfg.checkpoint.every_steps = 1;
  train(cfg, MPI_COMM_WORLD);
  auto refusal = [&](const std::function<void(ddp::TrainConfig&)>& change) {
    ddp::TrainConfig other = cfg;
    other.training.resume = "auto";
    change(other);
    auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
    try {
      ddp::Trainer trainer(other, *comm, nullptr);
    } catch (const ddp::CollectiveError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK_THAT(
      refusal([](auto& c) { c.optimizer.lr = 0.5; }),
      Catch::Contains("optimizer.lr: the checkpoint was written with 0.05, this run has 0.5"));
  CHECK_THAT(refusal([](auto& c) { c = ddp_test::with_adam(c, true, false); }),
             Catch::Contains("optimizer.name: the checkpoint was written with sgd, this run has "
                             "adamw"));
  CHECK_THAT(refusal([](auto& c) {
               c.model.layers = {12, 24, 17, 5};
             }),
             Catch::Contains("layers.1.weight' has shape [16, 24], the model's is [17, 24]"));
  CHECK_THAT(refusal([](auto& c) { c.data.train.samples = 191; }),
             Catch::Contains("training set of 190 samples, this run's has 191"));
  CHECK_THAT(refusal([](auto& c) { c.optimizer.momentum = 0.0; }),
             Catch::Contains("optimizer.momentum"));
}

TEST_CASE("non-finite gradients: abort names the step and rank, skip_step skips that step",
          "[mpi][nan]") {
  const int n = world_size();
  // Sharded, the non-finite count is summed from every rank's parts; with abort it rides on
  // the parameter allgather and is checked after it.
  for (bool shard : {false, true}) {
    INFO((shard ? "sharded optimizer" : "replicated optimizer"));
    const std::string dir = shared_scratch(shard ? "nan_shard" : "nan");
    const int64_t samples = 16 * n;
    const ddp_test::OverflowData data = ddp_test::write_overflow_data(dir, samples, 5);
    ddp::TrainConfig cfg = ddp_test::overflow_config(data, dir);  // sample 5: step 1, rank 5 % n
    cfg.distributed.shard_optimizer = shard;

    auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
    std::string message = "(no error)";
    try {
      ddp::Trainer trainer(cfg, *comm, nullptr);
      trainer.run();
    } catch (const ddp::CollectiveError& e) {
      message = e.what();
    }
    INFO(message);
    const int64_t bad_step = (5 / n) / 4 + 1;  // sample 5 is local sample 5 / n of rank 5 % n
    CHECK_THAT(message, Catch::Contains("epoch 1 step " + std::to_string(bad_step) + ": ") &&
                            Catch::Contains("non-finite gradient value(s) after the allreduce") &&
                            Catch::Contains("non-finite on rank " + std::to_string(5 % n)));

    cfg.training.nan_policy = ddp::NanPolicy::SkipStep;
    ddp::TrainSummary summary;
    const auto w = train(cfg, MPI_COMM_WORLD, &summary);
    CHECK(summary.skipped_steps == 2);  // the step with sample 5, once per epoch
    CHECK(summary.steps == 2 * 4);
    CHECK(std::isfinite(summary.train_loss));
    require_identical_replicas(w);
    for (const auto& t : w)
      for (float v : t.data) REQUIRE(std::isfinite(v));
    // Skipping is not doing nothing: the other steps trained.
    ddp::TrainConfig one_step = cfg;
    one_step.training.max_steps = 1;  // only the skipped step: the initial weights
    CHECK(max_abs_diff(train(one_step, MPI_COMM_WORLD), w) > 1e-4);
  }
}

namespace {

// resume_config with PowerSGD rank 2 (two of its weights sent as factors) from step 3.
ddp::TrainConfig powersgd_resume_config(const std::string& name) {
  ddp::TrainConfig cfg = resume_config(name);
  cfg.distributed.compression = ddp::Compression::PowerSgd;
  cfg.distributed.powersgd_rank = 2;
  cfg.distributed.powersgd_start_step = 3;
  return cfg;
}

// Trains `cfg` on `mpi_comm` with its rank 0's log kept; returns the log there ("" elsewhere),
// the weights into `weights`.
std::string train_logged(const ddp::TrainConfig& cfg, MPI_Comm mpi_comm,
                         std::vector<ddp::NamedTensor>* weights) {
  std::ostringstream log;
  auto comm = ddp::make_mpi_communicator(mpi_comm);
  ddp::Trainer trainer(cfg, *comm, &log);
  trainer.run();
  *weights = trainer.weights();
  return log.str();
}

}  // namespace

TEST_CASE("PowerSGD stopped and resumed: bitwise the uninterrupted run, its state checkpointed",
          "[mpi][resume][powersgd]") {
  const ddp::TrainConfig cfg = powersgd_resume_config("powersgd_whole");
  ddp::TrainSummary whole_summary;
  const auto whole = train(cfg, MPI_COMM_WORLD, &whole_summary);
  const int64_t per_epoch = whole_summary.steps / cfg.training.epochs;
  REQUIRE(per_epoch >= 4);
  // Before the first compressed step, at it, after it and in the next epoch.
  for (int64_t stop_at : {int64_t{2}, int64_t{3}, int64_t{4}, per_epoch + 1}) {
    INFO("stopped after step " << stop_at << " of " << whole_summary.steps);
    require_resumes_bitwise(cfg, "powersgd_part" + std::to_string(stop_at), stop_at, whole,
                            whole_summary.steps);
  }
  // The checkpoint holds every rank's error feedback and the factored weights' Q.
  ddp::TrainConfig part = cfg;
  part.output.dir = shared_scratch("powersgd_part4");
  const auto last = ddp::list_checkpoints(part.output.dir + "/checkpoints");
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  long errors = 0;
  if (world_rank() == 0 && !last.empty()) {
    const ddp::TrainingCheckpoint ck = ddp::read_checkpoint(last.back().second);
    CHECK(static_cast<int>(ck.powersgd.error.size()) == world_size());
    std::vector<std::string> factored;
    for (const ddp::NamedTensor& q : ck.powersgd.q) {
      factored.push_back(q.name + " " + ddp::shape_string(q.shape));
    }
    // 12-24-16-5: 24 x 12 and 16 x 24 gain from rank 2 factors; 5 x 16 and the biases do not.
    CHECK(factored ==
          std::vector<std::string>{"layers.0.weight [12, 2]", "layers.1.weight [24, 2]"});
    errors += factored.size() != 2 || static_cast<int>(ck.powersgd.error.size()) != world_size();
  }
  ddp_test::require_on_all_ranks(*comm, errors, "the PowerSGD state in the checkpoint");
}

TEST_CASE("PowerSGD resumed where its state cannot continue: it starts afresh and says why",
          "[mpi][resume][powersgd]") {
  ddp::TrainConfig first = powersgd_resume_config("powersgd_afresh");
  first.training.max_steps = 5;
  first.checkpoint.every_steps = 5;
  train(first, MPI_COMM_WORLD);
  ddp::TrainConfig plain = first;  // a checkpoint without PowerSGD's state
  plain.output.dir = shared_scratch("powersgd_afresh_plain");
  plain.distributed.compression = ddp::Compression::None;
  train(plain, MPI_COMM_WORLD);
  const auto resumed = [&](ddp::TrainConfig rest, MPI_Comm comm) {
    rest.distributed.compression = ddp::Compression::PowerSgd;
    rest.training.max_steps = 7;
    rest.training.resume = "auto";
    rest.checkpoint.every_steps = 0;  // leaves the checkpoint the next resume reads the newest
    std::vector<ddp::NamedTensor> weights;
    const std::string log = train_logged(rest, comm, &weights);
    if (comm == MPI_COMM_WORLD) require_identical_replicas(weights);
    return log;
  };
  ddp::TrainConfig rank3 = first;
  rank3.distributed.powersgd_rank = 3;
  const std::string other_rank = resumed(rank3, MPI_COMM_WORLD);
  ddp::TrainConfig rank4 = first;  // 24 x 12 gains nothing from rank-4 factors: sent whole
  rank4.distributed.powersgd_rank = 4;
  const std::string now_whole = resumed(rank4, MPI_COMM_WORLD);
  const std::string from_plain = resumed(plain, MPI_COMM_WORLD);
  if (world_rank() != 0) return;  // rank 0 writes the log
  CHECK_THAT(other_rank, Catch::Contains("resume: PowerSGD's error feedback and Q start afresh "
                                         "(its Q of layers.0.weight has rank 2, this run's "
                                         "factors 3)"));
  CHECK_THAT(now_whole, Catch::Contains("start afresh (its Q of layers.0.weight is for a weight "
                                        "this run sends whole)"));
  CHECK_THAT(from_plain, Catch::Contains("start afresh (the checkpoint holds none)"));
  if (world_size() < 2) return;
  // On one rank of the several that wrote it: each rank's error feedback has no rank to go to.
  ddp::TrainConfig one = first;
  one.training.batch_size *= world_size();
  const std::string on_one = resumed(one, MPI_COMM_SELF);
  CHECK_THAT(on_one, Catch::Contains("start afresh (the checkpoint holds the error feedback of " +
                                     std::to_string(world_size()) + " rank(s), this run has 1)"));
}
