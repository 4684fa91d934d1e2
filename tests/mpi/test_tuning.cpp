// distributed.tune: auto under mpiexec: a probe's timing is the slowest rank's median run and
// every wire's cost is the same on every rank; a tuned run trains with one choice on
// every rank, never lossier than its config, and the config.yaml it writes reruns it bitwise. At 4
// ranks the ranks stand in for 2 nodes x 2 (make_mpi_communicator's ranks_per_node), so the
// hierarchy is among the candidates.
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/link_probe.h"
#include "comm/mpi/mpi_communicator.h"
#include "config/tuning.h"
#include "ddp/trainer.h"
#include "mpi_test_helpers.h"

namespace {

// 2 nodes x 2 ranks at 4 ranks; the machine's own nodes otherwise.
std::unique_ptr<ddp::MpiCommunicator> communicator() {
  return ddp::make_mpi_communicator(MPI_COMM_WORLD, ddp_test::world_size() == 4 ? 2 : 0);
}

// Whether every rank holds the same cost.
bool same_everywhere(ddp::ProcessGroup& comm, const ddp::WireCost& c) {
  const double mine[2] = {c.alpha, c.beta};
  std::vector<double> all(2 * static_cast<size_t>(comm.size()));
  comm.allgather(mine, 2, all.data());
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] != mine[i % 2]) return false;
  return true;
}

}  // namespace

TEST_CASE("link probe: a timing is the slowest rank's median run, on every rank", "[mpi][tune]") {
  auto comm = communicator();
  const int rank = comm->rank();
  int calls = 0;
  // Rank r's runs take (r + 1) ms: the untimed one and the first timed one 30 ms more, the
  // second timed one 5 ms more. The timed runs sorted: r+1, r+1, r+6, r+31: the median r+6.
  const double t = ddp::time_collective(*comm, 4, [&] {
    const int call = calls++;
    const double ms = rank + 1.0 + (call < 2 ? 30.0 : 0.0) + (call == 2 ? 5.0 : 0.0);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  });
  CHECK(calls == 5);
  const double slowest = (comm->size() + 5) * 1e-3;  // the last rank's median
  CHECK(t >= slowest);
  CHECK(t < slowest + 0.020);  // not the 30 ms run
  double all_max = t, all_min = t;
  comm->allreduce(&all_max, 1, ddp::ReduceOp::Max);
  comm->allreduce(&all_min, 1, ddp::ReduceOp::Min);
  CHECK(all_max == all_min);
}

TEST_CASE("link probe: every wire's cost is the same on every rank", "[mpi][tune]") {
  if (ddp_test::world_size() < 2) return;
  auto comm = communicator();
  const ddp::ProbeSizes sizes;
  ddp::BucketWire bf16;
  bf16.format = ddp::Compression::Bf16;
  bf16.on_node = true;
  ddp::BucketWire unshared;
  unshared.shared_memory = false;
  std::vector<ddp::BucketWire> wires{ddp::BucketWire{}, bf16, unshared};
  if (ddp_test::world_size() == 4) {
    ddp::BucketWire hierarchical;
    hierarchical.hierarchical = true;
    wires.push_back(hierarchical);
  }
  for (const ddp::BucketWire& wire : wires) {
    const ddp::WireCost c = ddp::probe_wire(*comm, wire, sizes);
    INFO("format " << ddp::to_string(wire.format) << ", hierarchical " << wire.hierarchical
                   << ", shared memory " << wire.shared_memory << ": alpha " << c.alpha
                   << " s, beta " << c.beta << " s/float");
    CHECK(same_everywhere(*comm, c));
    // Whether 4 MiB measures slower than 1 KiB depends on the machine's load: a collective
    // whose peer lost its core costs a scheduler tick whatever its size (the bench measures).
    CHECK(c.seconds(sizes.large) > 0.0);
  }
  const ddp::WireCost factors = ddp::probe_factor_sums(*comm, sizes);
  CHECK(same_everywhere(*comm, factors));
  CHECK(factors.seconds(sizes.large) > 0.0);
  // The probes leave the job's communicator as it was.
  double x = comm->rank() + 1.0;
  comm->allreduce(&x, 1, ddp::ReduceOp::Sum);
  CHECK(x == comm->size() * (comm->size() + 1) / 2.0);
}

TEST_CASE("tune auto: one choice on every rank, said, no lossier than asked, and rerun bitwise",
          "[mpi][tune]") {
  if (ddp_test::world_size() < 2) return;
  ddp::TrainConfig cfg = ddp_test::two_epoch_config("ddp_tune_", "tuned");
  cfg.distributed.tune = ddp::Tune::Auto;
  cfg.distributed.compression = ddp::Compression::PowerSgd;
  cfg.distributed.powersgd_rank = 2;
  cfg.distributed.powersgd_start_step = 3;
  const auto train = [](const ddp::TrainConfig& c, std::string* log) {
    auto comm = communicator();
    std::ostringstream out;
    ddp::Trainer trainer(c, *comm, &out);
    trainer.run();
    *log = out.str();
    return trainer.weights();
  };
  std::string log;
  const auto tuned = train(cfg, &log);
  ddp_test::require_identical_replicas(tuned);
  if (ddp_test::world_rank() == 0) {
    CHECK_THAT(log, Catch::Contains("tune: measured in"));
    CHECK_THAT(log, Catch::Contains("PowerSGD rank 2 products"));
    CHECK_THAT(log, Catch::Contains("(chosen)"));
    CHECK_THAT(log, Catch::Contains("tune: chose "));
    CHECK_THAT(log, !Catch::Contains("powersgd rank 1,"));  // lossier than asked: not tried
  }
  // The run's config.yaml holds the choice with tune off; rerun from it, the same bits.
  ddp::TrainConfig again = ddp::load_config(cfg.output.dir + "/config.yaml");
  CHECK(again.distributed.tune == ddp::Tune::Off);
  CHECK(ddp::lossiness(again.distributed) <= ddp::lossiness(cfg.distributed));
  if (ddp_test::world_rank() == 0) {
    INFO(log);
    CHECK_THAT(log, Catch::Contains("tune: chose " + [&] {
                 ddp::TuneCandidate c;
                 const ddp::DistributedConfig& d = again.distributed;
                 c.compression = d.compression;
                 c.sum = d.compression_sum;
                 c.powersgd_rank = d.powersgd_rank;
                 c.hierarchical = d.hierarchical == ddp::Hierarchy::On;
                 c.first_bucket_mb = d.first_bucket_mb;
                 c.bucket_cap_mb = d.bucket_cap_mb;
                 return c.name();
               }()));
  }
  again.output.dir = ddp_test::shared_scratch_dir("ddp_tune_", "rerun");
  std::string rerun_log;
  REQUIRE(ddp_test::bitwise_equal(train(again, &rerun_log), tuned));
  if (ddp_test::world_rank() == 0) CHECK_THAT(rerun_log, !Catch::Contains("tune:"));
}

TEST_CASE("tune auto on one rank keeps the config's settings and says why", "[mpi][tune]") {
  ddp::TrainConfig cfg =
      ddp_test::small_training_config(ddp_test::shared_scratch_dir("ddp_tune_", "one_rank"));
  cfg.data.train.samples = 40;
  cfg.training.epochs = 1;
  cfg.distributed.tune = ddp::Tune::Auto;
  cfg.distributed.compression = ddp::Compression::Bf16;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm self = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank, 0, &self);
  cfg.output.dir += "/rank" + std::to_string(rank);
  {
    auto comm = ddp::make_mpi_communicator(self);
    std::ostringstream out;
    ddp::Trainer trainer(cfg, *comm, &out);
    trainer.run();
    CHECK_THAT(out.str(), Catch::Contains("tune: one rank: no gradient crosses ranks, the "
                                          "config's settings kept"));
  }
  MPI_Comm_free(&self);
  const ddp::TrainConfig written = ddp::load_config(cfg.output.dir + "/config.yaml");
  CHECK(written.distributed.tune == ddp::Tune::Off);
  CHECK(written.distributed.compression == ddp::Compression::Bf16);
}
