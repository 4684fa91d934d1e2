// PowerSGD on GPUs: the device compressor (comm/nccl/device_powersgd.h) against the float64
// transcription of the algorithm on rank-valued data at 1 rank and at the job's size (sums over
// ranks in rank order through MPI), its state after a non-finite step and through a checkpoint's
// round trip; and training with NCCL: identical replicas, close to the CPU's PowerSGD, a resume
// bitwise.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/nccl/device_powersgd.h"
#include "ddp/trainer.h"
#include "gpu_training_setup.h"
#include "mpi_test_helpers.h"
#include "powersgd_reference.h"

namespace {

using ddp::DevicePowerSgdBucket;
using ddp::PowerSgdOptions;
using ddp_gpu_test::gpu_per_rank;
using ddp_gpu_test::scratch_dir;
using ddp_gpu_test::small_config;
using ddp_test::require_on_all_ranks;
using ddp_test::powersgd::kNumel;
using ddp_test::powersgd::kParams;
using ddp_test::powersgd::rank_order_sum;
using ddp_test::powersgd::relative_gap;
using ddp_test::powersgd::share;

// The device's sums on the legacy stream, which the synchronous copies order with: the floats
// fetched, summed over `comm` in rank order, put back.
DevicePowerSgdBucket::DeviceSum device_sum(MPI_Comm comm) {
  return [comm](float* data, size_t count) {
    std::vector<float> host(count);
    ddp::cuda_copy_bytes(host.data(), data, count * sizeof(float));
    rank_order_sum(comm)(host.data(), count);
    ddp::cuda_copy_bytes(data, host.data(), count * sizeof(float));
  };
}

std::vector<float> shares(int me, int world, int step) {
  std::vector<float> v(kNumel);
  for (size_t i = 0; i < kNumel; ++i) v[i] = static_cast<float>(share(me, world, step, i));
  return v;
}

// Reduces `g` (host floats) through `bucket` on the device; the result back in `g`.
void reduce_on_device(DevicePowerSgdBucket& bucket, std::vector<float>& g, int world, MPI_Comm comm,
                      uint64_t seed) {
  ddp::DeviceArray<float> d(g.size());
  d.upload(g.data(), g.size());
  bucket.reduce(d.data(), world, false, seed, device_sum(comm), nullptr);
  d.download(g.data(), g.size());
}

ddp::PowerSgdLayout layout() { return {kParams, kNumel}; }

int sm_count() { return ddp::cuda_device_info(0).sm_count; }

// Three steps of a device bucket on `comm` against the reference; the failures counted.
long against_reference(MPI_Comm comm, const PowerSgdOptions& options) {
  int world = 0;
  MPI_Comm_size(comm, &world);
  DevicePowerSgdBucket bucket(layout(), options, sm_count());
  ddp_test::powersgd::Compressor c;
  c.reduce = [&](std::vector<float>& share, uint64_t seed) {
    reduce_on_device(bucket, share, world, comm, seed);
  };
  c.q = [&] { return bucket.q(); };
  c.error = [&] { return bucket.error(); };
  return ddp_test::powersgd::against_reference(comm, options, c, "a device");
}

}  // namespace

TEST_CASE("PowerSGD on a device: three steps against a float64 transcription, at 1 rank and at N",
          "[gpu][powersgd]") {
  auto world = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  long errors = 0;
  for (const int rank : {1, 2, 4}) {
    PowerSgdOptions o;
    o.rank = rank;
    errors += against_reference(MPI_COMM_SELF, o);
    errors += against_reference(MPI_COMM_WORLD, o);
  }
  PowerSgdOptions cold;
  cold.rank = 2;
  cold.warm_start = false;
  errors += against_reference(MPI_COMM_WORLD, cold);
  require_on_all_ranks(*world, errors, "PowerSGD steps on a device away from the reference");
}

TEST_CASE("PowerSGD on a device: vectors summed whole, full-rank factors give the mean",
          "[gpu][powersgd]") {
  auto world = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const int n = world->size(), me = world->rank();
  PowerSgdOptions o;
  o.rank = 2;
  DevicePowerSgdBucket bucket(layout(), o, sm_count());
  // The vectors and the small matrix travel whole: their sum exactly (n floats added in rank
  // order, in double, rounded once, as the mean below).
  std::vector<float> mine = shares(me, n, 1);
  std::vector<double> mean(kNumel, 0.0);
  for (size_t i = 0; i < kNumel; ++i)
    for (int q = 0; q < n; ++q) mean[i] += share(q, n, 1, i);
  reduce_on_device(bucket, mine, n, MPI_COMM_WORLD, 7);
  long errors = 0;
  for (size_t i : {288, 300, 311, 696, 711, 712, 791, 792, 796})
    errors += mine[i] != static_cast<float>(mean[i]);
  CHECK(errors == 0);
  // Full rank (every matrix's factors as wide as it; the shares are of rank 5 at most, so the
  // later columns are mostly rounding, which the second Gram-Schmidt pass keeps orthogonal):
  // P Q^T is the mean itself. Without error feedback no error is kept.
  PowerSgdOptions full;
  full.rank = 24;
  full.min_compression_rate = 0.0;
  full.error_feedback = false;
  DevicePowerSgdBucket exact(layout(), full, sm_count());
  mine = shares(me, n, 1);
  reduce_on_device(exact, mine, n, MPI_COMM_WORLD, 7);
  for (size_t i = 797; i < kNumel; ++i) mean[i] = 0.0;  // the padding: untouched, 0
  const double gap = relative_gap(mine, mean);
  INFO("full-rank factors on a device: within " << gap << " of the mean");
  errors += gap < 1e-5 ? 0 : 1;
  CHECK(gap < 1e-5);
  CHECK(exact.error().empty());
  CHECK(exact.q().size() == exact.plan().q_size());
  require_on_all_ranks(*world, errors, "ranks whose device PowerSGD sent the wrong things");
}

TEST_CASE("PowerSGD on a device: a non-finite step leaves no state; a state restores as kept",
          "[gpu][powersgd]") {
  auto world = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const int n = world->size(), me = world->rank();
  PowerSgdOptions o;
  o.rank = 2;
  // A fresh bucket's first step (seed 9) is what must follow the non-finite one.
  DevicePowerSgdBucket fresh(layout(), o, sm_count());
  std::vector<float> expected = shares(me, n, 3);
  reduce_on_device(fresh, expected, n, MPI_COMM_WORLD, 9);
  DevicePowerSgdBucket bucket(layout(), o, sm_count());
  CHECK(bucket.error().empty());
  CHECK(bucket.q().empty());
  std::vector<float> g = shares(me, n, 1);
  reduce_on_device(bucket, g, n, MPI_COMM_WORLD, 5);
  const std::vector<float> kept_error = bucket.error(), kept_q = bucket.q();
  REQUIRE(kept_error.size() == kNumel);
  REQUIRE(kept_q.size() == bucket.plan().q_size());
  // One rank's overflow: every rank's result is non-finite, and every rank drops its state.
  g = shares(me, n, 2);
  if (me == n - 1) g[300] = std::numeric_limits<float>::infinity();  // a bias: summed whole
  reduce_on_device(bucket, g, n, MPI_COMM_WORLD, 5);
  CHECK_FALSE(std::isfinite(g[300]));
  long errors = bucket.error().empty() && bucket.q().empty() ? 0 : 1;
  CHECK(errors == 0);
  g = shares(me, n, 3);
  reduce_on_device(bucket, g, n, MPI_COMM_WORLD, 9);
  errors += g != expected;
  CHECK(g == expected);
  // A checkpoint's state comes back as it was kept, and a wrong size is refused by name.
  bucket.restore(kept_error, kept_q);
  CHECK(bucket.error() == kept_error);
  CHECK(bucket.q() == kept_q);
  CHECK_THROWS_WITH(bucket.restore(kept_error, std::vector<float>(3)),
                    Catch::Contains("a Q of 3 floats"));
  require_on_all_ranks(*world, errors,
                       "ranks whose device PowerSGD kept a non-finite step's state");
}

TEST_CASE(
    "GPU training with PowerSGD over NCCL: one replica, the CPU's within rounding, resume "
    "bitwise",
    "[gpu][nccl][powersgd]") {
  if (!gpu_per_rank()) {
    WARN("skipped: NCCL needs one GPU per rank on this node");
    return;
  }
  const auto powersgd = [](ddp::TrainConfig cfg) {
    cfg.distributed.backend = ddp::BackendChoice::Nccl;
    cfg.distributed.compression = ddp::Compression::PowerSgd;
    cfg.distributed.powersgd_rank = 2;
    cfg.distributed.powersgd_start_step = 2;
    cfg.training.epochs = 1;  // 6 to 12 steps: the emulation is the slowest part of CI
    return cfg;
  };
  const ddp::TrainConfig whole = powersgd(small_config("psgd_whole", ddp::DeviceChoice::Cuda));
  ddp::TrainSummary s_whole;
  const auto w_whole = ddp_test::train(whole, MPI_COMM_WORLD, &s_whole);
  ddp_test::require_identical_replicas(w_whole);

  // The CPU's PowerSGD on the same job: the device sums in another order, which the power
  // iteration carries on (measured in the emulation: 2.2e-6 at 1 rank, 3.4e-7 at 2); the bound
  // of the other GPU-against-CPU runs.
  ddp::TrainConfig on_cpu = whole;
  on_cpu.device = ddp::DeviceChoice::Cpu;
  on_cpu.distributed.backend = ddp::BackendChoice::Mpi;
  on_cpu.output.dir = scratch_dir("psgd_cpu");
  const auto w_cpu = ddp_test::train(on_cpu, MPI_COMM_WORLD);
  double worst = 0.0;
  for (size_t t = 0; t < w_whole.size(); ++t)
    for (size_t i = 0; i < w_whole[t].data.size(); ++i)
      worst =
          std::max(worst, std::fabs(static_cast<double>(w_whole[t].data[i]) - w_cpu[t].data[i]) /
                              (std::fabs(static_cast<double>(w_cpu[t].data[i])) + 1e-3));
  worst = ddp_test::max_over_ranks(*ddp::make_mpi_communicator(MPI_COMM_WORLD), worst);
  INFO("max relative |w_gpu - w_cpu| = " << worst);
  CHECK(worst <= 1e-4);

  // Stopped after compressed steps and resumed: Q and the error feedback came back from the
  // checkpoint, so the run ends bitwise where the uninterrupted one did.
  ddp::TrainConfig first = whole;
  first.output.dir = scratch_dir("psgd_first");
  first.training.max_steps = 4;
  first.checkpoint.every_steps = 100;
  ddp::TrainSummary s_first;
  ddp_test::train(first, MPI_COMM_WORLD, &s_first);
  REQUIRE(s_first.steps == 4);
  ddp::TrainConfig rest = first;
  rest.training.max_steps = 0;
  rest.training.resume = "auto";
  ddp::TrainSummary s_rest;
  const auto w_rest = ddp_test::train(rest, MPI_COMM_WORLD, &s_rest);
  REQUIRE(s_rest.resumed);
  long differ = 0;
  for (size_t t = 0; t < w_whole.size(); ++t) differ += w_rest[t].data != w_whole[t].data;
  CHECK(differ == 0);
  require_on_all_ranks(*ddp::make_mpi_communicator(MPI_COMM_WORLD), differ,
                       "tensors of the resumed PowerSGD run not bitwise the uninterrupted run's");
}

TEST_CASE("PowerSGD on GPUs refuses a communicator other than NCCL's by name",
          "[gpu][powersgd][errors]") {
  auto host = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  CHECK_THROWS_WITH(ddp::nccl_powersgd_compressors(*host, {layout()}, PowerSgdOptions{}, 1),
                    Catch::Contains("distributed.compression: powersgd on GPUs needs the NCCL "
                                    "communicator (distributed.backend: nccl)"));
}
