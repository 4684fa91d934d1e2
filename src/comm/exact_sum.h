// Sums of float32 arrays whose bits depend on neither the order nor the grouping of the terms.
// Each term is rounded to a grid 2^e fixed by the largest magnitude among all the terms and by
// how many there are, so that every value and every partial sum is an integer multiple of 2^e
// below 2^53 * 2^e: exact in double. Any reduction tree, any MPI algorithm and any number of
// ranks then give the same sum, bit for bit (training.bitwise_across_world_sizes).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddp {

/// The most terms a grid is made for: 2^29 keeps at least 24 bits of the largest term (float32's
/// precision) on the grid.
constexpr int64_t kMaxExactTerms = int64_t{1} << 29;

/// The exponent e of the grid for up to `terms` values (1 <= terms <= kMaxExactTerms) each of
/// magnitude at most `max_abs` (finite, >= 0): the finest grid on which their sum, in any order,
/// is exact in double. The grid keeps min(51, 53 - ceil(log2(terms))) bits below the top of
/// max_abs's binade: 48 for 32 terms, never fewer than float32's 24. max_abs = 0 gives 0.
int exact_sum_exponent(double max_abs, int64_t terms);

/// sums[i] = the sum over c < count of x[c * stride + i], each term rounded to the nearest
/// multiple of 2^e (ties to even), counted in units of 2^e (integers). Every |term| must be at
/// most the max_abs `e` was made for, and count at most its `terms`.
void sum_on_grid(const float* x, size_t stride, size_t count, size_t n, int e, double* sums);

/// values_from_grid of sum_on_grid's sums, in one pass (a sum that needs no other rank's).
void sum_values_on_grid(const float* x, size_t stride, size_t count, size_t n, int e, float* out);

/// out[i] = acc[i] * 2^e rounded to float32 (to nearest, ties to even; beyond float32's range:
/// infinity, as a float32 sum would overflow).
void values_from_grid(const double* acc, size_t n, int e, float* out);

/// The largest |x[i]| (0 for n = 0), or +infinity when any x[i] is infinite or NaN.
double max_magnitude(const float* x, size_t n);

}  // namespace ddp
