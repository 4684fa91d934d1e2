// training.bitwise_across_world_sizes under mpiexec: the weights of N ranks are bitwise those of
// one process on the same global batch, and of any other world size that divides the global
// batch's chunk count (here N, 1, and 2 of 4 ranks), for SGD, AdamW with clipping and a
// schedule, gradient accumulation and bf16; a run stopped on N ranks and resumed on fewer ends
// bitwise where the uninterrupted one does; what cannot keep the bits is refused by name.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"
#include "ddp/trainer.h"
#include "mpi_test_helpers.h"

namespace {

using ddp_test::bitwise_equal;
using ddp_test::require_identical_replicas;
using ddp_test::train;
using ddp_test::world_rank;
using ddp_test::world_size;

std::string shared_scratch(const std::string& name) {
  return ddp_test::shared_scratch_dir("ddp_bitwise_", name);
}

std::string own_scratch(const std::string& name) {
  return ddp_test::scratch_dir("ddp_bitwise_own_", name);
}

// Global batches of 48 samples in 12 chunks of 4: every world size up to 4 holds whole chunks.
// 192 samples: 4 steps an epoch, no padding.
constexpr int64_t kGlobalBatch = 48;

ddp::TrainConfig bitwise_config(const std::string& name, uint64_t seed) {
  ddp::TrainConfig cfg = ddp_test::small_training_config(shared_scratch(name));
  cfg.data.train.samples = 192;
  cfg.data.seed = 7;
  cfg.training.seed = seed;
  cfg.training.epochs = 3;
  cfg.training.batch_size = kGlobalBatch / world_size();
  cfg.training.bitwise_across_world_sizes = true;
  cfg.training.bitwise_chunk_size = 4;
  return cfg;
}

// `cfg` (its batch_size is the world's share) trained on `ranks` ranks: groups of that many
// consecutive world ranks each train it alone, in their own folders; every rank returns its
// group's weights.
std::vector<ddp::NamedTensor> train_on(ddp::TrainConfig cfg, int ranks, const std::string& name) {
  const int n = world_size();
  cfg.training.batch_size = cfg.training.batch_size * n / ranks;
  cfg.output.dir =
      own_scratch(name + "_" + std::to_string(ranks) + "_" + std::to_string(world_rank() / ranks));
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() / ranks, world_rank(), &group);
  auto weights = train(cfg, group);
  MPI_Comm_free(&group);
  return weights;
}

// The world's weights for `cfg` and those of every smaller world size that divides it (groups of
// world ranks), bitwise equal; training moved them.
void require_same_bits_on_any_world(const ddp::TrainConfig& cfg, const std::string& name) {
  ddp::TrainSummary summary;
  const auto world = train(cfg, MPI_COMM_WORLD, &summary);
  REQUIRE(summary.steps >= 8);
  require_identical_replicas(world);
  for (int ranks = 1; ranks < world_size(); ++ranks) {
    if (world_size() % ranks != 0) continue;
    INFO("the world's " << world_size() << " ranks against " << ranks);
    REQUIRE(bitwise_equal(train_on(cfg, ranks, name), world));
  }
  ddp::TrainConfig untrained = cfg;
  untrained.training.max_steps = 1;
  REQUIRE_FALSE(bitwise_equal(train_on(untrained, 1, name + "_untrained"), world));
}

}  // namespace

TEST_CASE("bitwise_across_world_sizes: SGD with momentum gives the same bits on any world size",
          "[mpi][bitwise]") {
  for (uint64_t seed : {3, 4}) {
    INFO("seed " << seed);
    require_same_bits_on_any_world(bitwise_config("sgd", seed), "sgd");
  }
}

TEST_CASE("without bitwise_across_world_sizes the bits depend on the world size",
          "[mpi][bitwise]") {
  if (world_size() < 2) return;
  ddp::TrainConfig cfg = bitwise_config("default", 3);
  cfg.training.bitwise_across_world_sizes = false;
  const auto world = train(cfg, MPI_COMM_WORLD);
  // The equalities of the other cases are not vacuous: the default sums differ in the bits.
  REQUIRE_FALSE(bitwise_equal(train_on(cfg, 1, "default"), world));
}

TEST_CASE("bitwise_across_world_sizes: AdamW with clipping and a cosine schedule",
          "[mpi][bitwise]") {
  for (uint64_t seed : {3, 5}) {
    INFO("seed " << seed);
    ddp::TrainConfig cfg = ddp_test::with_adam(bitwise_config("adamw", seed), true, false);
    require_same_bits_on_any_world(ddp_test::with_schedule(cfg, ddp::SchedulerName::Cosine),
                                   "adamw");
  }
}

TEST_CASE("bitwise_across_world_sizes: gradient accumulation and bf16", "[mpi][bitwise]") {
  ddp::TrainConfig cfg = bitwise_config("accumulate", 6);
  cfg.training.batch_size = kGlobalBatch / 2 / world_size();
  cfg.training.accumulate_steps = 2;
  cfg.training.bitwise_chunk_size = 2;
  require_same_bits_on_any_world(cfg, "accumulate");
  cfg = bitwise_config("bf16", 6);
  cfg.training.precision = ddp::Precision::Bf16;
  require_same_bits_on_any_world(cfg, "bf16");
}

TEST_CASE("bitwise_across_world_sizes: stopped on N ranks, resumed on fewer, bitwise the same",
          "[mpi][bitwise][resume]") {
  const int n = world_size();
  if (n < 2) return;
  ddp::TrainConfig cfg = ddp_test::with_schedule(
      ddp_test::with_adam(bitwise_config("whole", 8), true, false), ddp::SchedulerName::Cosine);
  cfg.scheduler.total_steps = 12;  // the stopped run's schedule is the whole run's
  const auto whole = train(cfg, MPI_COMM_WORLD);
  ddp::TrainConfig first = cfg;
  first.output.dir = shared_scratch("stopped");
  first.training.max_steps = 5;  // inside the second epoch
  first.checkpoint.every_steps = 5;
  train(first, MPI_COMM_WORLD);
  // Half the ranks continue (rank 0's group from rank 0's checkpoint); the others wait.
  const int half = n / 2;
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < half ? 0 : MPI_UNDEFINED, 0, &group);
  std::vector<ddp::NamedTensor> resumed = whole;
  if (group != MPI_COMM_NULL) {
    ddp::TrainConfig rest = first;
    rest.training.max_steps = 0;
    rest.training.resume = "auto";
    rest.training.batch_size = cfg.training.batch_size * n / half;
    ddp::TrainSummary summary;
    resumed = train(rest, group, &summary);
    CHECK(summary.resumed);
    CHECK(summary.steps == 12);
    MPI_Comm_free(&group);
  }
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  for (auto& t : resumed) comm->broadcast(t.data.data(), t.data.size() * sizeof(float), 0);
  REQUIRE(bitwise_equal(resumed, whole));
}

TEST_CASE("bitwise_across_world_sizes: a resume that changes the global batch is refused",
          "[mpi][bitwise][resume]") {
  ddp::TrainConfig first = bitwise_config("refused", 3);
  first.training.max_steps = 2;
  first.checkpoint.every_steps = 2;
  train(first, MPI_COMM_WORLD);
  ddp::TrainConfig rest = first;
  rest.training.max_steps = 0;
  rest.training.resume = "auto";
  rest.training.batch_size = first.training.batch_size * 2;
  REQUIRE_THROWS_WITH(train(rest, MPI_COMM_WORLD),
                      Catch::Contains("training.bitwise_across_world_sizes") &&
                          Catch::Contains("global batch of 48") &&
                          Catch::Contains("set training.batch_size"));
}

TEST_CASE("bitwise_across_world_sizes: a padded last batch is refused, naming data.drop_last",
          "[mpi][bitwise]") {
  ddp::TrainConfig cfg = bitwise_config("padded", 3);
  cfg.data.train.samples = 190;
  REQUIRE_THROWS_WITH(train(cfg, MPI_COMM_WORLD),
                      Catch::Contains("training.bitwise_across_world_sizes") &&
                          Catch::Contains("190 samples") &&
                          Catch::Contains("data.drop_last: true"));
  cfg.data.drop_last = true;  // the 46 left over are dropped on every world size alike
  require_same_bits_on_any_world(cfg, "dropped");
}

TEST_CASE("bitwise_across_world_sizes: a non-finite chunk names its rank, skip_step skips alike",
          "[mpi][bitwise][nan]") {
  const int n = world_size();
  const std::string dir = shared_scratch("nan");
  const ddp_test::OverflowData data = ddp_test::write_overflow_data(dir, 16 * n, 5);
  ddp::TrainConfig cfg = ddp_test::overflow_config(data, dir);  // sample 5: step 1, rank 5 % n
  cfg.training.bitwise_across_world_sizes = true;
  cfg.training.bitwise_chunk_size = 2;
  std::string message = "(no error)";
  try {
    train(cfg, MPI_COMM_WORLD);
  } catch (const ddp::CollectiveError& e) {
    message = e.what();
  }
  INFO(message);
  const int64_t bad_step = (5 / n) / 4 + 1;
  CHECK_THAT(message, Catch::Contains("epoch 1 step " + std::to_string(bad_step) + ": ") &&
                          Catch::Contains("non-finite gradient value(s) after the allreduce") &&
                          Catch::Contains("non-finite on rank " + std::to_string(5 % n)));

  cfg.training.nan_policy = ddp::NanPolicy::SkipStep;
  ddp::TrainSummary summary;
  const auto w = train(cfg, MPI_COMM_WORLD, &summary);
  CHECK(summary.skipped_steps == 2);  // the step with sample 5, once per epoch
  CHECK(summary.steps == 2 * 4);
  require_identical_replicas(w);
  for (const auto& t : w)
    for (float v : t.data) REQUIRE(std::isfinite(v));
  // The same skip and the same bits on one rank with the whole global batch.
  ddp::TrainConfig one = cfg;
  one.output.dir = own_scratch("nan_one");
  one.training.batch_size = 4 * n;
  ddp::TrainSummary one_summary;
  REQUIRE(bitwise_equal(train(one, MPI_COMM_SELF, &one_summary), w));
  CHECK(one_summary.skipped_steps == 2);
}
