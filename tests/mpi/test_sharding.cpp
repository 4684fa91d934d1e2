// distributed.shard_optimizer (ZeRO stage 1) under mpiexec: each rank updates its parts of the
// buckets from the reduce-scattered gradients and the parameters are allgathered. The sums are
// the unsharded allreduce's, in the same rank order, and the update is elementwise, so sharded
// training gives bitwise the unsharded weights, for every optimizer, with clipping, schedules
// and accumulation, the update fused into the reduce-scatters or not; its checkpoints hold the same
// tensors, and either resumes the other.
#include <catch2/catch.hpp>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "ddp/trainer.h"
#include "io/training_checkpoint.h"
#include "mpi_test_helpers.h"

namespace {

using ddp_test::bitwise_equal;
using ddp_test::max_abs_diff;
using ddp_test::require_identical_replicas;
using ddp_test::train;

std::string shared_scratch(const std::string& name) {
  return ddp_test::shared_scratch_dir("ddp_shard_", name);
}

// 190 samples (the last batch of an epoch is partial), 2 accumulated micro-batches of 7.
ddp::TrainConfig shard_config(const std::string& name) {
  ddp::TrainConfig cfg = ddp_test::small_training_config(shared_scratch(name));
  cfg.data.train.samples = 190;
  cfg.data.seed = 13;
  cfg.training.seed = 9;
  cfg.training.batch_size = 7;
  cfg.training.accumulate_steps = 2;
  cfg.training.epochs = 2;
  cfg.training.log_every = 3;  // logged steps compute the norm from the shards' partial sums
  return cfg;
}

ddp::TrainConfig sharded(ddp::TrainConfig cfg) {
  cfg.distributed.shard_optimizer = true;
  cfg.output.dir += "/sharded";
  return cfg;
}

// train(), and whether the update ran inside the reduce-scatters (distributed.
// overlap_optimizer), from rank 0's startup log, on every rank.
std::vector<ddp::NamedTensor> train_noting_fusion(const ddp::TrainConfig& cfg,
                                                  ddp::TrainSummary* summary, bool* fused) {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  std::ostringstream log;
  ddp::Trainer trainer(cfg, *comm, &log);
  *summary = trainer.run();
  int said = log.str().find("as its reduce-scatter sums it") != std::string::npos;
  MPI_Bcast(&said, 1, MPI_INT, 0, MPI_COMM_WORLD);
  *fused = said != 0;
  return trainer.weights();
}

struct Case {
  std::string name;
  ddp::TrainConfig cfg;
};

std::vector<Case> optimizer_cases() {
  using ddp::SchedulerName;
  using ddp_test::with_adam;
  using ddp_test::with_schedule;
  ddp::TrainConfig nesterov = shard_config("nesterov");
  nesterov.optimizer.nesterov = true;
  return {
      {"sgd, momentum, weight decay", shard_config("sgd")},
      {"sgd, nesterov, warmup + step, clipped", with_schedule(nesterov, SchedulerName::Step)},
      {"adam", with_adam(shard_config("adam"), false, false)},
      {"adamw, amsgrad", with_adam(shard_config("adamw"), true, true)},
      {"adamw, warmup + cosine, clipped",
       with_schedule(with_adam(shard_config("adamw_cos"), true, false), SchedulerName::Cosine)},
  };
}

}  // namespace

TEST_CASE("sharded optimizer: bitwise the unsharded weights, every optimizer, both paths",
          "[mpi][shard]") {
  for (const Case& c : optimizer_cases()) {
    INFO(c.name);
    ddp::TrainSummary whole_summary;
    const auto whole = train(c.cfg, MPI_COMM_WORLD, &whole_summary);
    REQUIRE(whole_summary.steps >= 8);
    // One node's window sums in rank order; so does the MPI path (an all-to-all of the parts,
    // summed by their owners in rank order), unlike MPI_Allreduce whose order is the library's.
    // The update runs inside the reduce-scatters during backward, or after backward: fused
    // wherever nothing of the whole gradient is needed first (not with clipping).
    for (bool shared : {true, false}) {
      for (bool overlap : {true, false}) {
        INFO((shared ? "shared-memory window" : "MPI all-to-all reduce-scatter / allgather"));
        INFO("distributed.overlap_optimizer: " << overlap);
        ddp::TrainConfig cfg = sharded(c.cfg);
        cfg.distributed.shared_memory = shared;
        cfg.distributed.overlap_optimizer = overlap;
        cfg.output.dir += std::string(shared ? "/shm" : "/mpi") + (overlap ? "_fused" : "");
        ddp::TrainSummary shard_summary;
        bool fused = false;
        const auto shard = train_noting_fusion(cfg, &shard_summary, &fused);
        REQUIRE(fused == (overlap && c.cfg.training.clip_grad_norm == 0));
        REQUIRE(shard_summary.steps == whole_summary.steps);
        require_identical_replicas(shard);
        INFO("max |sharded - unsharded| = " << max_abs_diff(shard, whole));
        REQUIRE(bitwise_equal(shard, whole));
      }
    }
  }
}

TEST_CASE("a sharded run's checkpoint holds the unsharded run's tensors; each resumes the other",
          "[mpi][shard][resume]") {
  const ddp::TrainConfig cfg = ddp_test::with_adam(shard_config("ck"), true, true);
  ddp::TrainSummary whole_summary;
  const auto whole = train(cfg, MPI_COMM_WORLD, &whole_summary);
  const int64_t stop_at = whole_summary.steps / 2 + 1;
  // Both runs stop at the same step and checkpoint it.
  auto stopped = [&](ddp::TrainConfig c, const std::string& dir) {
    c.output.dir = shared_scratch(dir);
    c.training.max_steps = stop_at;
    c.checkpoint.every_steps = 1000;  // periodic: the last step is checkpointed at the end
    ddp::TrainSummary s;
    train(c, MPI_COMM_WORLD, &s);
    REQUIRE(s.last_checkpoint.size() > 0);
    return std::make_pair(c, s.last_checkpoint);
  };
  const auto [plain, plain_file] = stopped(cfg, "ck_plain");
  const auto [shard, shard_file] = stopped(sharded(cfg), "ck_shard");
  const ddp::TrainingCheckpoint a = ddp::read_checkpoint(plain_file);
  const ddp::TrainingCheckpoint b = ddp::read_checkpoint(shard_file);
  REQUIRE(bitwise_equal(a.weights, b.weights));
  REQUIRE(a.optimizer.size() == 3);
  REQUIRE(b.optimizer.size() == a.optimizer.size());
  for (size_t i = 0; i < a.optimizer.size(); ++i) {
    INFO("optimizer state " << a.optimizer[i].name);
    REQUIRE(b.optimizer[i].name == a.optimizer[i].name);
    REQUIRE(bitwise_equal(a.optimizer[i].tensors, b.optimizer[i].tensors));
  }
  REQUIRE(b.state.optimizer_steps == a.state.optimizer_steps);
  // The unsharded checkpoint resumed sharded and the sharded one resumed unsharded.
  for (const auto& [from, shard_rest] : {std::pair{plain, true}, std::pair{shard, false}}) {
    INFO((shard_rest ? "unsharded checkpoint resumed sharded"
                     : "sharded checkpoint resumed unsharded"));
    ddp::TrainConfig rest = from;
    rest.distributed.shard_optimizer = shard_rest;
    rest.training.max_steps = 0;
    rest.training.resume = "auto";
    ddp::TrainSummary s;
    const auto resumed = train(rest, MPI_COMM_WORLD, &s);
    CHECK(s.resumed);
    CHECK(s.steps == whole_summary.steps);
    REQUIRE(bitwise_equal(resumed, whole));
  }
}
