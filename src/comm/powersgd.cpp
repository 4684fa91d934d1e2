// PowerSGD's compressor of one bucket (powersgd.h).
#include "comm/powersgd.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/check.h"
#include "core/random.h"

namespace ddp {

void orthogonalize_columns(float* a, size_t rows, size_t cols) {
  const auto dot = [&](size_t x, size_t y) {
    double d = 0.0;
    for (size_t i = 0; i < rows; ++i) d += double{a[i * cols + x]} * a[i * cols + y];
    return d;
  };
  for (size_t c = 0; c < cols; ++c) {
    // Twice against every column before it: once is not enough where the column is mostly
    // rounding (a gradient of rank below the factors'), the second pass makes it orthogonal.
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t before = 0; before < c; ++before) {
        const double d = dot(before, c);
        for (size_t i = 0; i < rows; ++i)
          a[i * cols + c] = static_cast<float>(a[i * cols + c] - d * a[i * cols + before]);
      }
    }
    const double norm = std::sqrt(dot(c, c));
    if (norm > 0.0) {
      for (size_t i = 0; i < rows; ++i)
        a[i * cols + c] = static_cast<float>(a[i * cols + c] / norm);
    }
  }
}

PowerSgdPlan::PowerSgdPlan(std::vector<GradientMatrix> params, size_t numel,
                           const PowerSgdOptions& options)
    : numel_(numel) {
  DDP_CHECK(options.rank >= 1, "PowerSGD: the rank must be at least 1, got " << options.rank);
  size_t end = 0;
  for (const GradientMatrix& m : params) {
    DDP_CHECK(m.offset >= end && m.offset + m.rows * m.cols <= numel,
              "PowerSGD: a parameter of " << m.rows << " x " << m.cols << " at " << m.offset
                                          << " overlaps another or leaves the bucket of " << numel);
    end = m.offset + m.rows * m.cols;
    Entry p;
    p.m = m;
    const size_t r = std::min({m.rows, m.cols, static_cast<size_t>(options.rank)});
    const double sent = static_cast<double>((m.rows + m.cols) * r);
    if (sent * options.min_compression_rate < static_cast<double>(m.rows * m.cols)) {
      p.rank = r;
      p.p_at = p_size_;
      p.q_at = q_size_;
      p_size_ += m.rows * r;
      q_size_ += m.cols * r;
    } else {
      whole_ += m.rows * m.cols;
    }
    plan_.push_back(p);
  }
}

void check_powersgd_state(const PowerSgdPlan& plan, const std::vector<float>& error,
                          const std::vector<float>& q) {
  DDP_CHECK(error.empty() || error.size() == plan.numel(),
            "PowerSGD state: an error feedback of " << error.size() << " floats for a bucket of "
                                                    << plan.numel());
  DDP_CHECK(q.empty() || q.size() == plan.q_size(),
            "PowerSGD state: a Q of " << q.size() << " floats where the bucket's factors take "
                                      << plan.q_size());
}

PowerSgdBucket::PowerSgdBucket(std::vector<GradientMatrix> params, size_t numel,
                               const PowerSgdOptions& options)
    : plan_(std::move(params), numel, options), options_(options) {}

void PowerSgdBucket::reduce(float* bucket, int world, const SumOverRanks& sum, uint64_t seed) {
  if (options_.error_feedback) {
    if (error_.empty()) error_.assign(plan_.numel(), 0.0f);
    for (const PowerSgdPlan::Entry& p : plan_.entries()) {
      float* g = bucket + p.m.offset;
      const float* e = error_.data() + p.m.offset;
      for (size_t i = 0; i < p.m.rows * p.m.cols; ++i) g[i] += e[i];
    }
  }
  if (options_.error_feedback)
    share_.assign(bucket, bucket + plan_.numel());  // for this step's error
  if (q_.empty() || !options_.warm_start) {
    start_q(seed);
  } else {
    for (const PowerSgdPlan::Entry& p : plan_.entries())
      if (p.rank > 0) orthogonalize_columns(q_.data() + p.q_at, p.m.cols, p.rank);
  }
  // The first sum: the whole parameters, then P.
  wire_.resize(plan_.whole_floats() + plan_.p_size());
  size_t at = 0;
  for (const PowerSgdPlan::Entry& p : plan_.entries()) {
    if (p.rank > 0) continue;
    std::copy_n(bucket + p.m.offset, p.m.rows * p.m.cols, wire_.data() + at);
    at += p.m.rows * p.m.cols;
  }
  float* p_all = wire_.data() + plan_.whole_floats();
  compute_p(bucket, p_all);
  if (!wire_.empty()) sum(wire_.data(), wire_.size());
  at = 0;
  for (const PowerSgdPlan::Entry& p : plan_.entries()) {
    if (p.rank > 0) continue;
    std::copy_n(wire_.data() + at, p.m.rows * p.m.cols, bucket + p.m.offset);
    at += p.m.rows * p.m.cols;
  }
  // The second: Q from the orthogonalised P.
  for (const PowerSgdPlan::Entry& p : plan_.entries())
    if (p.rank > 0) orthogonalize_columns(p_all + p.p_at, p.m.rows, p.rank);
  compute_q(bucket, p_all);
  if (!q_.empty()) sum(q_.data(), q_.size());
  decompress(p_all, bucket);
  if (!std::all_of(bucket, bucket + plan_.numel(), [](float v) { return std::isfinite(v); })) {
    error_.clear();  // every rank sees the same result: all start afresh
    q_.clear();
    return;
  }
  if (options_.error_feedback) {
    const float inv_world = 1.0f / static_cast<float>(world);
    for (const PowerSgdPlan::Entry& p : plan_.entries()) {
      for (size_t i = p.m.offset; i < p.m.offset + p.m.rows * p.m.cols; ++i)
        error_[i] = share_[i] - bucket[i] * inv_world;
    }
  }
}

void PowerSgdBucket::restore(std::vector<float> error, std::vector<float> q) {
  check_powersgd_state(plan_, error, q);
  error_ = std::move(error);
  q_ = std::move(q);
}

// Q's random start: standard normal values from `seed`, each matrix's Q orthogonalised.
void PowerSgdBucket::start_q(uint64_t seed) {
  q_.assign(plan_.q_size(), 0.0f);
  Rng rng(seed);
  for (float& v : q_) v = static_cast<float>(rng.normal());
  for (const PowerSgdPlan::Entry& p : plan_.entries())
    if (p.rank > 0) orthogonalize_columns(q_.data() + p.q_at, p.m.cols, p.rank);
}

namespace {

// Sum of a[j] * b[j] for j < n in double: eight running sums (lane l takes j = l mod 8), added
// pairwise at the end; a fixed order, so the same bits on every rank, and one the compiler
// vectorises.
double dot8(const float* a, const float* b, size_t n) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (size_t l = 0; l < 8; ++l) lane[l] += double{a[j + l]} * b[j + l];
  for (size_t l = 0; j < n; ++j, ++l) lane[l] += double{a[j]} * b[j];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

}  // namespace

// P = M Q for every compressed matrix: each row of M against each column of Q (transposed
// first, so both are contiguous).
void PowerSgdBucket::compute_p(const float* bucket, float* p_all) {
  for (const PowerSgdPlan::Entry& p : plan_.entries()) {
    if (p.rank == 0) continue;
    const size_t r = p.rank, cols = p.m.cols;
    const float* q = q_.data() + p.q_at;
    qt_.resize(r * cols);
    for (size_t j = 0; j < cols; ++j)
      for (size_t k = 0; k < r; ++k) qt_[k * cols + j] = q[j * r + k];
    const float* m = bucket + p.m.offset;
    float* out = p_all + p.p_at;
    for (size_t i = 0; i < p.m.rows; ++i)
      for (size_t k = 0; k < r; ++k)
        out[i * r + k] = static_cast<float>(dot8(m + i * cols, qt_.data() + k * cols, cols));
  }
}

// Q = M^T P for every compressed matrix, into q_: row by row of M, each added to the r columns'
// double sums (rows in order).
void PowerSgdBucket::compute_q(const float* bucket, const float* p_all) {
  for (const PowerSgdPlan::Entry& p : plan_.entries()) {
    if (p.rank == 0) continue;
    const size_t r = p.rank, cols = p.m.cols;
    const float* m = bucket + p.m.offset;
    const float* pm = p_all + p.p_at;
    acc_.assign(r * cols, 0.0);  // transposed: column k's sums at k * cols
    for (size_t i = 0; i < p.m.rows; ++i) {
      const float* row = m + i * cols;
      for (size_t k = 0; k < r; ++k) {
        const double pik = pm[i * r + k];
        double* sums = acc_.data() + k * cols;
        for (size_t j = 0; j < cols; ++j) sums[j] += row[j] * pik;
      }
    }
    float* q = q_.data() + p.q_at;
    for (size_t j = 0; j < cols; ++j)
      for (size_t k = 0; k < r; ++k) q[j * r + k] = static_cast<float>(acc_[k * cols + j]);
  }
}

// M = P Q^T for every compressed matrix: each row the columns of Q^T weighted by P's row, in
// double, factors in order.
void PowerSgdBucket::decompress(const float* p_all, float* bucket) {
  for (const PowerSgdPlan::Entry& p : plan_.entries()) {
    if (p.rank == 0) continue;
    const size_t r = p.rank, cols = p.m.cols;
    const float* pm = p_all + p.p_at;
    const float* q = q_.data() + p.q_at;
    qt_.resize(r * cols);
    for (size_t j = 0; j < cols; ++j)
      for (size_t k = 0; k < r; ++k) qt_[k * cols + j] = q[j * r + k];
    acc_.resize(cols);
    float* m = bucket + p.m.offset;
    for (size_t i = 0; i < p.m.rows; ++i) {
      std::fill(acc_.begin(), acc_.begin() + static_cast<ptrdiff_t>(cols), 0.0);
      for (size_t k = 0; k < r; ++k) {
        const double pik = pm[i * r + k];
        const float* qk = qt_.data() + k * cols;
        for (size_t j = 0; j < cols; ++j) acc_[j] += pik * qk[j];
      }
      for (size_t j = 0; j < cols; ++j) m[i * cols + j] = static_cast<float>(acc_[j]);
    }
  }
}

}  // namespace ddp
