// PowerSGD's compressor (comm/powersgd.h) under mpiexec, against a float64 transcription of the
// algorithm on rank-valued data: at 1 rank (each rank alone) and at the job's size, three steps
// with warm start and error feedback, the result, Q and this rank's error after each step within
// float32's reach of the reference; every rank the same bits; whole vectors summed exactly; and
// factors of full rank giving back the mean itself.
#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "comm/powersgd.h"
#include "core/random.h"
#include "ddp/trainer.h"
#include "mpi_test_helpers.h"
#include "powersgd_reference.h"

using ddp::GradientMatrix;
using ddp::PowerSgdBucket;
using ddp::PowerSgdOptions;
using ddp_test::require_on_all_ranks;
using ddp_test::powersgd::kNumel;
using ddp_test::powersgd::kParams;
using ddp_test::powersgd::rank_order_sum;
using ddp_test::powersgd::relative_gap;
using ddp_test::powersgd::share;

namespace {

// Three steps of a host bucket on `comm` against the reference; the failures counted.
long against_reference(MPI_Comm comm, const PowerSgdOptions& options) {
  int world = 0;
  MPI_Comm_size(comm, &world);
  PowerSgdBucket bucket(kParams, kNumel, options);
  ddp_test::powersgd::Compressor c;
  c.reduce = [&](std::vector<float>& share, uint64_t seed) {
    bucket.reduce(share.data(), world, rank_order_sum(comm), seed);
  };
  c.q = [&] { return bucket.q(); };
  c.error = [&] { return bucket.error(); };
  return ddp_test::powersgd::against_reference(comm, options, c, "the host");
}

}  // namespace

TEST_CASE("PowerSGD: three steps against a float64 transcription, at 1 rank and at N",
          "[powersgd]") {
  auto world = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  long errors = 0;
  for (int rank : {1, 2, 4}) {
    PowerSgdOptions o;
    o.rank = rank;
    errors += against_reference(MPI_COMM_SELF, o);
    errors += against_reference(MPI_COMM_WORLD, o);
  }
  PowerSgdOptions cold;  // Q from a new random start at every step
  cold.rank = 2;
  cold.warm_start = false;
  errors += against_reference(MPI_COMM_WORLD, cold);
  require_on_all_ranks(*world, errors, "ranks whose PowerSGD left the reference");
}

TEST_CASE("PowerSGD: what is sent, vectors summed whole, full-rank factors give the mean",
          "[powersgd]") {
  auto world = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const int n = world->size(), me = world->rank();
  PowerSgdOptions o;
  o.rank = 2;
  PowerSgdBucket bucket(kParams, kNumel, o);
  // (24 + 12) * 2 * 2 < 288: compressed; (16 + 24) * 2 * 2 < 384: compressed; (5 + 16) * 2 * 2
  // = 84 >= 80: whole, as the vectors.
  CHECK(bucket.plan().compressed(0));
  CHECK(bucket.plan().compressed(2));
  CHECK_FALSE(bucket.plan().compressed(4));
  CHECK_FALSE(bucket.plan().compressed(1));
  CHECK(bucket.plan().sent_floats() == 24 + 16 + 80 + 5 + (24 + 12) * 2 + (16 + 24) * 2);
  // The vectors and the small matrix travel whole: their sum exactly (n floats added in rank
  // order, in double, rounded once, as the mean below).
  std::vector<float> mine(kNumel);
  std::vector<double> mean(kNumel, 0.0);
  for (size_t i = 0; i < kNumel; ++i) {
    mine[i] = static_cast<float>(share(me, n, 1, i));
    for (int q = 0; q < n; ++q) mean[i] += share(q, n, 1, i);
  }
  bucket.reduce(mine.data(), n, rank_order_sum(MPI_COMM_WORLD), 7);
  long errors = 0;
  for (size_t i : {288, 300, 311, 696, 711, 712, 791, 792, 796})
    errors += mine[i] != static_cast<float>(mean[i]);
  CHECK(errors == 0);
  // Full rank (every matrix's factors as wide as it): P Q^T is the mean itself.
  PowerSgdOptions full;
  full.rank = 24;
  full.min_compression_rate = 0.0;
  full.error_feedback = false;
  PowerSgdBucket exact(kParams, kNumel, full);
  for (size_t i = 0; i < kNumel; ++i) mine[i] = static_cast<float>(share(me, n, 1, i));
  exact.reduce(mine.data(), n, rank_order_sum(MPI_COMM_WORLD), 7);
  for (size_t i = 797; i < kNumel; ++i) mean[i] = 0.0;  // the padding: untouched, 0
  const double gap = relative_gap(mine, mean);
  INFO("full-rank factors: within " << gap << " of the mean");
  errors += gap < 1e-5 ? 0 : 1;
  CHECK(gap < 1e-5);
  require_on_all_ranks(*world, errors, "ranks whose PowerSGD bucket sent the wrong things");
}

TEST_CASE("PowerSGD: a checkpoint's state of another bucket is refused", "[powersgd]") {
  PowerSgdOptions o;
  PowerSgdBucket bucket(kParams, kNumel, o);
  CHECK_THROWS_WITH(bucket.restore(std::vector<float>(10), {}),
                    Catch::Contains("an error feedback of 10 floats for a bucket of 805"));
  CHECK_THROWS_WITH(bucket.restore({}, std::vector<float>(3)),
                    Catch::Contains("a Q of 3 floats where the bucket's factors take"));
  CHECK_THROWS_WITH(PowerSgdBucket({{0, 30, 30}}, 100, o),
                    Catch::Contains("leaves the bucket of 100"));
}

TEST_CASE("PowerSGD: a non-finite step leaves no state, the next starts as the first did",
          "[powersgd]") {
  auto world = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const int n = world->size(), me = world->rank();
  PowerSgdOptions o;
  o.rank = 2;
  const auto step_of = [&](int step) {
    std::vector<float> v(kNumel);
    for (size_t i = 0; i < kNumel; ++i) v[i] = static_cast<float>(share(me, n, step, i));
    return v;
  };
  // A fresh bucket's first step (seed 9) is what must follow the non-finite one.
  PowerSgdBucket fresh(kParams, kNumel, o);
  std::vector<float> expected = step_of(3);
  fresh.reduce(expected.data(), n, rank_order_sum(MPI_COMM_WORLD), 9);
  PowerSgdBucket bucket(kParams, kNumel, o);
  std::vector<float> g = step_of(1);
  bucket.reduce(g.data(), n, rank_order_sum(MPI_COMM_WORLD), 5);
  REQUIRE_FALSE(bucket.error().empty());
  // One rank's overflow: every rank's result is non-finite, and every rank drops its state.
  g = step_of(2);
  if (me == n - 1) g[300] = std::numeric_limits<float>::infinity();  // a bias: summed whole
  bucket.reduce(g.data(), n, rank_order_sum(MPI_COMM_WORLD), 5);
  CHECK_FALSE(std::isfinite(g[300]));
  long errors = bucket.error().empty() && bucket.q().empty() ? 0 : 1;
  CHECK(errors == 0);
  g = step_of(3);
  bucket.reduce(g.data(), n, rank_order_sum(MPI_COMM_WORLD), 9);
  errors += g != expected;
  CHECK(g == expected);
  require_on_all_ranks(*world, errors, "ranks whose PowerSGD kept a non-finite step's state");
}

namespace {

// The training tests' MLP (12-24-16-5: two weights of rank 2 factors, one too small) for 2
// epochs of 13 steps (190 samples over the job, 7 a batch on each of 2 ranks).
ddp::TrainConfig powersgd_config(const std::string& name, int64_t start_step) {
  ddp::TrainConfig cfg = ddp_test::two_epoch_config("ddp_powersgd_", name);
  cfg.distributed.compression = ddp::Compression::PowerSgd;
  cfg.distributed.powersgd_rank = 2;
  cfg.distributed.powersgd_start_step = start_step;
  return cfg;
}

}  // namespace

TEST_CASE("PowerSGD training: whole sums before the start step, then factors, one replica",
          "[powersgd][training]") {
  ddp::TrainConfig none = powersgd_config("none", 0);
  none.distributed.compression = ddp::Compression::None;
  ddp::TrainSummary exact_sum, late_sum, early_sum;
  const auto exact = ddp_test::train(none, MPI_COMM_WORLD, &exact_sum);
  // Before its start step every bucket takes the path it takes without compression: the bits.
  const auto late = ddp_test::train(powersgd_config("late", 1000), MPI_COMM_WORLD, &late_sum);
  REQUIRE(ddp_test::bitwise_equal(late, exact));
  // From step 4 on the factors: every rank holds the same weights, which are not the exact ones,
  // and the loss stays near the exact run's.
  const auto early = ddp_test::train(powersgd_config("early", 3), MPI_COMM_WORLD, &early_sum);
  ddp_test::require_identical_replicas(early);
  const double off = ddp_test::max_abs_diff(early, exact);
  INFO("PowerSGD rank 2 from step 4: max |w - exact| = " << off << ", train loss "
                                                         << early_sum.train_loss << " (exact "
                                                         << exact_sum.train_loss << ")");
  CHECK(off > 0.0);
  CHECK(std::isfinite(early_sum.train_loss));
  CHECK(std::abs(early_sum.train_loss - exact_sum.train_loss) < 0.1 * exact_sum.train_loss);
}
