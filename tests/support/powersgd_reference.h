// PowerSGD's float64 reference for the tests of its compressors on the host (tests/mpi) and on a
// device (tests/gpu): a bucket of a small MLP's kind, rank-valued shares, sums over ranks in rank
// order, and the algorithm transcribed in double for every rank at once.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/powersgd.h"
#include "core/random.h"
#include "kernel_references.h"

namespace ddp_test {
namespace powersgd {

using ddp::GradientMatrix;
using ddp::PowerSgdOptions;

// A bucket of the 12-24-16-5 MLP's kind: each weight, then its bias (a vector, never
// compressed), and 8 floats of padding no parameter covers.
inline const std::vector<GradientMatrix> kParams = {{0, 24, 12},  {288, 24, 1}, {312, 16, 24},
                                                    {696, 16, 1}, {712, 5, 16}, {792, 5, 1}};
constexpr size_t kNumel = 805;

// Rank q's share of step s (the gradient pre-scaled by 1/world), 0 in the padding: a few
// smooth patterns with rank-dependent weights, so the sum has a spread of singular values.
inline double share(int q, int world, int step, size_t i) {
  if (i >= 797) return 0.0;
  const double x = static_cast<double>(i);
  const double v = std::sin(0.37 * x + 1.3 * q + 0.71 * step) +
                   0.5 * std::cos(0.11 * x * (1 + q % 3) + 0.2 * step) + 0.1 * (q + 1);
  return static_cast<double>(static_cast<float>(v / world));
}

// The sums over ranks: every rank's floats gathered, added in rank order in double.
inline ddp::SumOverRanks rank_order_sum(MPI_Comm comm) {
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
      ddp_kernel_test::orthogonalize_columns(qm, m.cols, r);
      std::vector<double> p(m.rows * r, 0.0);
      for (int k = 0; k < world; ++k)
        for (size_t i = 0; i < m.rows; ++i)
          for (size_t j = 0; j < m.cols; ++j)
            for (size_t c = 0; c < r; ++c)
              p[i * r + c] += in[k][m.offset + i * m.cols + j] * qm[j * r + c];
      ddp_kernel_test::orthogonalize_columns(p, m.rows, r);
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
inline double relative_gap(const std::vector<float>& a, const std::vector<double>& b) {
  double gap = 0.0, scale = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    gap = std::max(gap, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? gap / scale : gap;
}

// A compressor under test, one bucket of kParams: `reduce` turns this rank's share into the
// result (the sums over `comm` in rank order, with rank_order_sum), `q` and `error` read its
// state.
struct Compressor {
  std::function<void(std::vector<float>& share, uint64_t seed)> reduce;
  std::function<std::vector<float>()> q, error;
};

// Three steps of `c` on `comm` against the reference: the result, Q and this rank's error after
// each within float32's reach, every rank the same bits. The failures counted.
inline long against_reference(MPI_Comm comm, const PowerSgdOptions& options, const Compressor& c,
                              const char* where) {
  int world = 0, me = 0;
  MPI_Comm_size(comm, &world);
  MPI_Comm_rank(comm, &me);
  Reference ref(world, options);
  long errors = 0;
  for (int step = 1; step <= 3; ++step) {
    std::vector<std::vector<double>> in(static_cast<size_t>(world), std::vector<double>(kNumel));
    for (int q = 0; q < world; ++q)
      for (size_t i = 0; i < kNumel; ++i) in[q][i] = share(q, world, step, i);
    std::vector<float> mine(in[me].begin(), in[me].end());
    c.reduce(mine, 42 + step);
    const std::vector<double> expected = ref.step(in, 42 + step);
    const std::vector<double> expected_q(ref.q.begin(), ref.q.end());
    const double result_gap = relative_gap(mine, expected);
    const double q_gap = relative_gap(c.q(), expected_q);
    const double error_gap = relative_gap(c.error(), ref.errors[me]);
    INFO(where << ", " << world << " rank(s), PowerSGD rank " << options.rank << ", step " << step
               << ": result within " << result_gap << ", Q within " << q_gap
               << ", this rank's error within " << error_gap << " of the float64 reference");
    // Measured up to 2.3e-7 (result, Q) and 1.9e-6 (the error: small where the factors catch
    // nearly all of a rank's share, so float32's rounding of that share weighs more in it), on
    // the host and on a device alike.
    const bool close = result_gap < 1e-6 && q_gap < 1e-6 && error_gap < 1e-5;
    CHECK(close);
    errors += !close;
    // Every rank holds the same bits.
    std::vector<float> rank0 = mine;
    MPI_Bcast(rank0.data(), static_cast<int>(kNumel), MPI_FLOAT, 0, comm);
    const bool same = rank0 == mine;
    CHECK(same);
    errors += !same;
  }
  return errors;
}

}  // namespace powersgd
}  // namespace ddp_test
