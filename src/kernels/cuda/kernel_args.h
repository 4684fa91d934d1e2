// The argument structs our kernels take by value, apart from the kernels themselves: the kernel
// headers (*.cuh) hold definitions and are included by the one file that launches them, while
// these plain structs are shared with the backend's declaration.
#pragma once

#include <cstdint>

namespace ddp {
namespace cuda {

/// Operand layouts, each row-major in memory:
///   A(m,k) = a_k_contiguous ? a[m*lda + k] : a[k*lda + m]
///   B(k,n) = b_k_contiguous ? b[n*ldb + k] : b[k*ldb + n]
struct GemmArgs {
  int m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  const float* bias = nullptr;  ///< [n], added to every row, or null
  const float* mask = nullptr;  ///< [m, n] with leading dim ldc: C = mask > 0 ? C : 0, or null
  bool relu = false;            ///< C = max(C, 0), NaN kept (torch.relu)
  bool accumulate = false;      ///< C += result instead of C = result
  float* partial = nullptr;     ///< split-K: [splits][m][n] raw sums (no epilogue), or null
  int k_per_split = 0;          ///< K range of one slice (a multiple of every tile's BK)
};

/// The mixed-precision GEMM (gemm16.cuh): A and B are 16-bit (one format, bit patterns), laid
/// out as GemmArgs's; C is float32 (c32) or the format (c16), exactly one of them set, with
/// leading dim ldc. C = epilogue(A·B): + bias[n] (float32), ReLU, then for c16 the mask (C =
/// mask > 0 ? C : 0, mask [m, n] 16-bit with leading dim ldc) and the rounding; for c32 with
/// accumulate, C += the result.
struct Gemm16Args {
  int m = 0, n = 0, k = 0;
  const uint16_t* a = nullptr;
  int64_t lda = 0;
  const uint16_t* b = nullptr;
  int64_t ldb = 0;
  float* c32 = nullptr;
  uint16_t* c16 = nullptr;
  int64_t ldc = 0;
  const float* bias = nullptr;
  const uint16_t* mask = nullptr;
  bool relu = false;
  bool accumulate = false;
};

/// The batch totals the host reads back (and a first-pass block's share of them).
struct XentTotals {
  double loss_sum;
  long long correct;
  long long first_bad_row;  ///< -1 when every label is valid
  int bad_label;
};

/// What the per-row pass leaves for the total: loss of the row (double, as the CPU backend
/// sums), and 1 / 0 for correct, or -1 for a label outside [0, classes); and the totals' first
/// pass's per-block partials (reduction_plan.h: xent_total_blocks).
struct XentRowOut {
  double* loss;
  int* status;
  XentTotals* partials;
};

/// What the gradient-norm pass leaves in device memory: the L2 norm, and the factor the
/// gradients are scaled by (clip_coefficient when it is below 1, else exactly 1).
struct NormResult {
  double norm;
  float coef;
};

/// The 16-bit float types of the gradient casts (core/float16.h): bfloat16 and IEEE binary16.
enum class Float16Type { Bf16, Fp16 };

}  // namespace cuda
}  // namespace ddp
