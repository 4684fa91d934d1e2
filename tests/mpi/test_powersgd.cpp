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

using ddp::GradientMatrix;
using ddp::PowerSgdBucket;
using ddp::PowerSgdOptions;
using ddp_test::require_on_all_ranks;

namespace {

// A bucket of the 12-24-16-5 MLP's kind: each weight, then its bias (a vector, never
// compressed), and 8 floats of padding no parameter covers.
const std::vector<GradientMatrix> kParams = {
    {0, 24, 12}, {288, 24, 1}, {312, 16, 24}, {696, 16, 1}, {712, 5, 16}, {792, 5, 1}};
constexpr size_t kNumel = 805;

// Rank q's share of step s (the gradient pre-scaled by 1/world), 0 in the padding: a few
// smooth patterns with rank-dependent weights, so the sum has a spread of singular values.
double share(int q, int world, int step, size_t i) {
  if (i >= 797) return 0.0;
  const double x = static_cast<double>(i);
  const double v = std::sin(0.37 * x + 1.3 * q + 0.71 * step) +
                   0.5 * std::cos(0.11 * x * (1 + q % 3) + 0.2 * step) + 0.1 * (q + 1);
  return static_cast<double>(static_cast<float>(v / world));
}

// The sums over ranks: every rank's floats gathered, added in rank order in double.
ddp::SumOverRanks rank_order_sum(MPI_Comm comm) {
  return [comm](float* data, size_t count) {
    int world = 0;
    MPI_Comm_size(comm, &world);
    std::vector<float> all(count * static_cast<size_t>(world));
    MPI_Allgather(data, static_cast<int>(count), MPI_FLOAT, all.data(), static_cast<int>(count),
                  MPI_FLOAT, comm);
    for (size_t i = 0; i < count; ++i) {
      double s = 0.0;
      for (int q = 0; q < world; ++q) s += all[static_cast<size_t>(q) * count + i];
      data[i] = static_cast<float>(s);
    }
  };
}

// Gram-Schmidt in double as orthogonalize_columns: each column projected out of the ones
// before it twice, then normalised; zero columns left zero.
void orthogonalize(std::vector<double>& a, size_t rows, size_t cols) {
  const auto dot = [&](size_t x, size_t y) {
    double d = 0.0;
    for (size_t i = 0; i < rows; ++i) d += a[i * cols + x] * a[i * cols + y];
    return d;
  };
  for (size_t c = 0; c < cols; ++c) {
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t before = 0; before < c; ++before) {
        const double d = dot(before, c);
        for (size_t i = 0; i < rows; ++i) a[i * cols + c] -= d * a[i * cols + before];
      }
    }
    const double norm = std::sqrt(dot(c, c));
    if (norm > 0.0)
      for (size_t i = 0; i < rows; ++i) a[i * cols + c] /= norm;
  }
}

// The algorithm in double for every rank at once: each step's result, Q and errors.
struct Reference {
  Reference(int world, const PowerSgdOptions& o) : world(world), options(o) {
    errors.assign(static_cast<size_t>(world), std::vector<double>(kNumel, 0.0));
  }

  size_t rank_of(const GradientMatrix& m) const {
    const size_t r = std::min({m.rows, m.cols, static_cast<size_t>(options.rank)});
    const bool compress =
        static_cast<double>((m.rows + m.cols) * r) * options.min_compression_rate <
        static_cast<double>(m.rows * m.cols);
    return compress ? r : 0;
  }

  // One step: `in[q]` is rank q's share; the result every rank gets.
  std::vector<double> step(std::vector<std::vector<double>> in, uint64_t seed) {
    for (int q = 0; q < world; ++q)
      for (size_t i = 0; i < kNumel; ++i) in[q][i] += errors[q][i];
    std::vector<double> result(kNumel, 0.0);
    if (q.empty() || !options.warm_start) {  // the compressor's draws, in the same order
      q.clear();
      ddp::Rng rng(seed);
      for (const GradientMatrix& m : kParams)
        for (size_t x = 0; x < m.cols * rank_of(m); ++x)
          q.push_back(static_cast<float>(rng.normal()));
    }
    size_t q_at = 0;
    for (const GradientMatrix& m : kParams) {
      const size_t r = rank_of(m), n = m.rows * m.cols;
      if (r == 0) {
        for (size_t i = 0; i < n; ++i)
          for (int k = 0; k < world; ++k) result[m.offset + i] += in[k][m.offset + i];
        continue;
      }
      std::vector<double> qm(q.begin() + q_at, q.begin() + q_at + m.cols * r);
      orthogonalize(qm, m.cols, r);
      std::vector<double> p(m.rows * r, 0.0);
      for (int k = 0; k < world; ++k)
        for (size_t i = 0; i < m.rows; ++i)
          for (size_t j = 0; j < m.cols; ++j)
            for (size_t c = 0; c < r; ++c)
              p[i * r + c] += in[k][m.offset + i * m.cols + j] * qm[j * r + c];
      orthogonalize(p, m.rows, r);
      std::fill(qm.begin(), qm.end(), 0.0);
      for (int k = 0; k < world; ++k)
        for (size_t i = 0; i < m.rows; ++i)
          for (size_t j = 0; j < m.cols; ++j)
            for (size_t c = 0; c < r; ++c)
              qm[j * r + c] += in[k][m.offset + i * m.cols + j] * p[i * r + c];
      for (size_t i = 0; i < m.rows; ++i)
        for (size_t j = 0; j < m.cols; ++j)
          for (size_t c = 0; c < r; ++c)
            result[m.offset + i * m.cols + j] += p[i * r + c] * qm[j * r + c];
      std::copy(qm.begin(), qm.end(), q.begin() + q_at);
      q_at += m.cols * r;
    }
    for (int k = 0; k < world; ++k)
      for (const GradientMatrix& m : kParams)
        for (size_t i = m.offset; i < m.offset + m.rows * m.cols; ++i)
          errors[k][i] = in[k][i] - result[i] / world;
    return result;
  }

  int world;
  PowerSgdOptions options;
  std::vector<double> q;  // every matrix's Q, in order (empty before the first step)
  std::vector<std::vector<double>> errors;
};

// max |a - b| over max |b|.
double relative_gap(const std::vector<float>& a, const std::vector<double>& b) {
  double gap = 0.0, scale = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    gap = std::max(gap, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? gap / scale : gap;
}

// Three steps on `comm` against the reference; the errors counted.
long against_reference(MPI_Comm comm, const PowerSgdOptions& options) {
  int world = 0, me = 0;
  MPI_Comm_size(comm, &world);
  MPI_Comm_rank(comm, &me);
  PowerSgdBucket bucket(kParams, kNumel, options);
  Reference ref(world, options);
  long errors = 0;
  for (int step = 1; step <= 3; ++step) {
    std::vector<std::vector<double>> in(static_cast<size_t>(world), std::vector<double>(kNumel));
    for (int q = 0; q < world; ++q)
      for (size_t i = 0; i < kNumel; ++i) in[q][i] = share(q, world, step, i);
    std::vector<float> mine(in[me].begin(), in[me].end());
    bucket.reduce(mine.data(), world, rank_order_sum(comm), 42 + step);
    const std::vector<double> expected = ref.step(in, 42 + step);
    std::vector<double> expected_q(ref.q.begin(), ref.q.end());
    const double result_gap = relative_gap(mine, expected);
    const double q_gap = relative_gap(bucket.q(), expected_q);
    const double error_gap = relative_gap(bucket.error(), ref.errors[me]);
    INFO(world << " rank(s), PowerSGD rank " << options.rank << ", step " << step
               << ": result within " << result_gap << ", Q within " << q_gap
               << ", this rank's error within " << error_gap << " of the float64 reference");
    // Measured up to 2.3e-7 (result, Q) and 1.9e-6 (the error: small where the factors catch
    // nearly all of a rank's share, so float32's rounding of that share weighs more in it).
    const bool close = result_gap < 1e-6 && q_gap < 1e-6 && error_gap < 1e-5;
    CHECK(close);
    errors += !close;
    // Every rank holds the same bits.
    std::vector<float> rank0 = mine;
    MPI_Bcast(rank0.data(), static_cast<int>(kNumel), MPI_FLOAT, 0, comm);
    const bool same = std::equal(mine.begin(), mine.end(), rank0.begin());
    CHECK(same);
    errors += !same;
  }
  return errors;
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
  CHECK(bucket.compressed(0));
  CHECK(bucket.compressed(2));
  CHECK_FALSE(bucket.compressed(4));
  CHECK_FALSE(bucket.compressed(1));
  CHECK(bucket.sent_floats() == 24 + 16 + 80 + 5 + (24 + 12) * 2 + (16 + 24) * 2);
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
