// Order-independent sums on a grid (exact_sum.h).
#include "comm/exact_sum.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"

namespace ddp {

namespace {

int ceil_log2(int64_t n) {
  int bits = 0;
  while ((int64_t{1} << bits) < n) ++bits;
  return bits;
}

// Adding and subtracting 1.5 * 2^52 rounds a double of magnitude below 2^51 to an integer in
// the current rounding mode (to nearest, ties to even) in two vectorisable additions, where
// std::nearbyint is a library call per value. Valid only without -ffast-math, which the build
// never sets.
constexpr double kRoundingShift = 6755399441055744.0;  // 1.5 * 2^52

}  // namespace

int exact_sum_exponent(double max_abs, int64_t terms) {
  DDP_CHECK(terms >= 1 && terms <= kMaxExactTerms,
            "exact sum of " << terms << " terms (1 to 2^29)");
  DDP_CHECK(std::isfinite(max_abs) && max_abs >= 0,
            "exact sum: the largest magnitude is " << max_abs);
  if (max_abs == 0) return 0;
  int top = 0;
  std::frexp(max_abs, &top);  // max_abs < 2^top
  // A rounded term is at most 2^bits units and `terms` of them at most 2^53 units; below 2^51
  // units the rounding shift is exact.
  const int bits = std::min(51, 53 - ceil_log2(terms));
  return top - bits;
}

namespace {

// The grid sums of the terms, a block of 512 values at a time (their sums stay in L1 across the
// terms), each block handed to store(first, sums, len).
template <typename Store>
void sum_blocks(const float* x, size_t stride, size_t count, size_t n, int e, Store store) {
  const double to_units = std::ldexp(1.0, -e);  // exact: x * 2^-e only moves the exponent
  constexpr size_t kBlock = 512;
  double block[kBlock];
  for (size_t first = 0; first < n; first += kBlock) {
    const size_t len = std::min(kBlock, n - first);
    std::fill(block, block + len, 0.0);
    for (size_t c = 0; c < count; ++c) {
      const float* term = x + c * stride + first;
      for (size_t i = 0; i < len; ++i) {
        const double units = static_cast<double>(term[i]) * to_units;
        block[i] += (units + kRoundingShift) - kRoundingShift;
      }
    }
    store(first, block, len);
  }
}

}  // namespace

void sum_on_grid(const float* x, size_t stride, size_t count, size_t n, int e, double* sums) {
  sum_blocks(x, stride, count, n, e, [sums](size_t first, const double* block, size_t len) {
    std::copy(block, block + len, sums + first);
  });
}

void sum_values_on_grid(const float* x, size_t stride, size_t count, size_t n, int e, float* out) {
  sum_blocks(x, stride, count, n, e, [out, e](size_t first, const double* block, size_t len) {
    values_from_grid(block, len, e, out + first);
  });
}

void values_from_grid(const double* acc, size_t n, int e, float* out) {
  const double unit = std::ldexp(1.0, e);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(acc[i] * unit);
}

double max_magnitude(const float* x, size_t n) {
  // On the bit patterns with the sign cleared, the integer order is the magnitudes' order and
  // every infinity or NaN is above FLT_MAX's: an integer maximum, which vectorises.
  uint32_t most = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bits &= 0x7fffffffu;
    most = bits > most ? bits : most;
  }
  if (most > 0x7f7fffffu) return std::numeric_limits<double>::infinity();
  float largest;
  std::memcpy(&largest, &most, sizeof largest);
  return static_cast<double>(largest);
}

}  // namespace ddp
