// PowerSGD (Vogels, Karimireddy and Jaggi, 2019; PyTorch's powerSGD_hook): a bucket's gradient
// matrices sent as rank-r factors. For each matrix M (a parameter's gradient, rows x cols, where
// the compression saves enough: (rows + cols) * r * min_compression_rate < rows * cols):
//   P = M Q (Q: cols x r, a seeded random start, then the last step's), summed over ranks,
//   orthogonalised (Gram-Schmidt); Q = M^T P, summed over ranks; M ~ P Q^T.
// Vectors and small matrices travel whole, summed as they are. Error feedback: what the
// approximation missed of this rank's share is added to its next step's gradient.
//
// The bucket holds this rank's share of the mean (the gradient pre-scaled by 1/world, so the sum
// over ranks is the mean), as every gradient path does. The error of a rank is its share less a
// world-th of the result: summed over ranks that is the mean less its approximation, what
// PyTorch's hook keeps per rank (it sums unscaled gradients and divides Q by the world size).
//
// Every rank computes the same bits: the sums are the caller's (one sum, the same on every
// rank), the rest is this file's loops in a fixed order, double accumulation, no threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace ddp {

/// One parameter's gradient as the compressor sees it: rows x cols floats, row-major, at
/// `offset` in the bucket. A vector (a bias) is rows x 1.
struct GradientMatrix {
  size_t offset = 0;
  size_t rows = 0, cols = 0;
};

struct PowerSgdOptions {
  int rank = 1;                       ///< r: the factors' columns (at most min(rows, cols))
  double min_compression_rate = 2.0;  ///< PyTorch's min_compression_rate
  bool warm_start = true;             ///< Q starts from the last step's (else random each step)
  bool error_feedback = true;
};

/// Sums `count` floats over the ranks in place, the same bits on every rank (blocking).
using SumOverRanks = std::function<void(float* data, size_t count)>;

/// Which of a bucket's parameters travel as factors, of what rank, and where their factors lie.
class PowerSgdPlan {
 public:
  /// `params` lie in a bucket of `numel` floats, in bucket order, not overlapping.
  PowerSgdPlan(std::vector<GradientMatrix> params, size_t numel, const PowerSgdOptions& options);

  size_t matrices() const { return plan_.size(); }
  const GradientMatrix& matrix(size_t i) const { return plan_[i].m; }
  /// Whether parameter i is sent as factors, and their rank (0: sent whole).
  bool compressed(size_t i) const { return plan_[i].rank > 0; }
  size_t factor_rank(size_t i) const { return plan_[i].rank; }
  /// Where parameter i's P lies among the P factors (rows x factor_rank(i), row-major) and its
  /// Q in Q (cols x factor_rank(i)).
  size_t p_offset(size_t i) const { return plan_[i].p_at; }
  size_t q_offset(size_t i) const { return plan_[i].q_at; }
  size_t whole_floats() const { return whole_; }
  size_t p_size() const { return p_size_; }
  size_t q_size() const { return q_size_; }
  /// Floats this rank sends per step: the whole parameters, then P and Q.
  size_t sent_floats() const { return whole_ + p_size_ + q_size_; }
  size_t numel() const { return numel_; }

  /// Parameter i as planned: the accessors above in one.
  struct Entry {
    GradientMatrix m;
    size_t rank = 0;  ///< 0: sent whole
    size_t p_at = 0, q_at = 0;
  };
  const std::vector<Entry>& entries() const { return plan_; }

 private:
  std::vector<Entry> plan_;
  size_t numel_ = 0, whole_ = 0, p_size_ = 0, q_size_ = 0;
};

/// The compressor of one bucket on the host and its state (Q, the error feedback).
class PowerSgdBucket {
 public:
  /// `params` lie in a bucket of `numel` floats, in bucket order, not overlapping.
  PowerSgdBucket(std::vector<GradientMatrix> params, size_t numel, const PowerSgdOptions& options);

  /// Replaces this rank's share in `bucket` by the approximated sum over ranks (the same on
  /// every rank), in two sums over ranks: the whole parameters with the P factors, then the Q
  /// factors. `world`: the number of ranks. `seed`: Q's random start when it needs one (the
  /// first compressed step; every step without warm start), the same on every rank. A result
  /// with a non-finite value (an overflow, a diverged step that the trainer skips or stops on)
  /// leaves no state behind: the next step starts afresh, as the first compressed one.
  void reduce(float* bucket, int world, const SumOverRanks& sum, uint64_t seed);

  const PowerSgdPlan& plan() const { return plan_; }

  /// The state a checkpoint keeps: the error feedback (numel floats; empty before the first
  /// compressed step or without error feedback) and Q (the factors' Q, empty before the first
  /// compressed step or without warm start).
  const std::vector<float>& error() const { return error_; }
  const std::vector<float>& q() const { return q_; }
  /// Restores that state; sizes other than this bucket's throw ddp::Error.
  void restore(std::vector<float> error, std::vector<float> q);

 private:
  void start_q(uint64_t seed);
  void compute_p(const float* bucket, float* p);
  void compute_q(const float* bucket, const float* p);
  void decompress(const float* p, float* bucket);

  PowerSgdPlan plan_;
  PowerSgdOptions options_;
  std::vector<float> error_, q_;
  std::vector<float> wire_;   ///< the whole parameters, then P: the first sum's floats
  std::vector<float> share_;  ///< this step's error-corrected share, for its error
  std::vector<float> qt_;     ///< scratch: a matrix's Q transposed (r x cols)
  std::vector<double> acc_;   ///< scratch: double sums of a row or of Q's columns
};

/// Checks a state for `plan` (PowerSgdBucket::restore's rule): throws ddp::Error where the
/// error feedback or Q is neither empty nor the bucket's size.
void check_powersgd_state(const PowerSgdPlan& plan, const std::vector<float>& error,
                          const std::vector<float>& q);

/// Orthonormalises the columns of the rows x cols row-major matrix `a` in place: Gram-Schmidt in
/// column order, each column projected out of the ones before it twice (orthogonal to float
/// precision even where it is mostly rounding), then normalised; double accumulation. A column
/// that is zero after the projections stays zero instead of dividing by zero.
void orthogonalize_columns(float* a, size_t rows, size_t cols);

}  // namespace ddp
