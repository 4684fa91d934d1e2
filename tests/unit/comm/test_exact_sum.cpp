// The order-independent sums of training.bitwise_across_world_sizes (comm/exact_sum.h): the same
// bits for any order and grouping of the terms, within their bound of the exact sum, and the
// grid's edges (zero, one term, the most terms, the largest magnitude, non-finite values).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "comm/exact_sum.h"
#include "core/check.h"

namespace {

// `terms` x `n` floats of magnitudes spread over 2^-40 .. 2^8 with both signs, and some zeros.
std::vector<float> spread_terms(size_t terms, size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-40, 8);
  std::vector<float> x(terms * n);
  for (float& v : x)
    v = gen() % 17 == 0 ? 0.0f : static_cast<float>(std::ldexp(mantissa(gen), exponent(gen)));
  return x;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

}  // namespace

TEST_CASE("exact sums: any order and any grouping of the terms give the same bits",
          "[exact_sum][bitwise]") {
  const size_t terms = 48, n = 1500;  // n > the 512-value block: a ragged last block
  const std::vector<float> x = spread_terms(terms, n, 1);
  const double largest = ddp::max_magnitude(x.data(), x.size());
  const int e = ddp::exact_sum_exponent(largest, terms);
  std::vector<double> all(n);
  ddp::sum_on_grid(x.data(), n, terms, n, e, all.data());

  std::mt19937 gen(2);
  for (int trial = 0; trial < 20; ++trial) {
    // The terms shuffled, cut into groups of random sizes (the ranks), each group summed on the
    // grid alone, the groups' sums added in a random order (an allreduce's).
    std::vector<size_t> order(terms);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);
    std::vector<float> shuffled(x.size());
    for (size_t t = 0; t < terms; ++t)
      std::copy_n(x.begin() + order[t] * n, n, shuffled.begin() + t * n);
    std::vector<std::vector<double>> groups;
    for (size_t first = 0; first < terms;) {
      const size_t len = std::min<size_t>(terms - first, 1 + gen() % 7);
      groups.emplace_back(n);
      ddp::sum_on_grid(shuffled.data() + first * n, n, len, n, e, groups.back().data());
      first += len;
    }
    std::shuffle(groups.begin(), groups.end(), gen);
    std::vector<double> total(n, 0.0);
    for (const auto& g : groups)
      for (size_t i = 0; i < n; ++i) total[i] += g[i];
    INFO("trial " << trial << ": " << groups.size() << " groups");
    REQUIRE(same_bits(total, all));
  }
}

TEST_CASE("exact sums: within half a grid step a term of the exact sum, then float32 rounding",
          "[exact_sum][bitwise]") {
  const size_t terms = 32, n = 2000;
  const std::vector<float> x = spread_terms(terms, n, 3);
  const double largest = ddp::max_magnitude(x.data(), x.size());
  const int e = ddp::exact_sum_exponent(largest, terms);
  CHECK(std::ldexp(1.0, e) <= largest * std::ldexp(1.0, -47));  // 48 bits below for 32 terms
  std::vector<double> sums(n);
  ddp::sum_on_grid(x.data(), n, terms, n, e, sums.data());
  std::vector<float> out(n);
  ddp::values_from_grid(sums.data(), n, e, out.data());
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    long double exact = 0;
    for (size_t t = 0; t < terms; ++t) exact += x[t * n + i];  // 64-bit mantissa: exact here
    const double grid_error = static_cast<double>(std::fabs(sums[i] * std::ldexp(1.0L, e) - exact));
    worst = std::max(worst, grid_error / std::ldexp(1.0, e));
    const double tolerance = terms * std::ldexp(1.0, e) / 2 +
                             std::fabs(static_cast<double>(exact)) * std::ldexp(1.0, -24);
    REQUIRE(std::fabs(out[i] - static_cast<double>(exact)) <= tolerance);
  }
  INFO("worst grid error " << worst << " grid steps");
  CHECK(worst <= terms / 2.0);
}

TEST_CASE("exact sums: the grid's edges", "[exact_sum][bitwise]") {
  CHECK(ddp::exact_sum_exponent(0.0, 7) == 0);
  CHECK(ddp::exact_sum_exponent(1.0, 1) == 1 - 51);  // 1 < 2^1, 51 bits below
  CHECK(ddp::exact_sum_exponent(1.0, 32) == 1 - 48);
  CHECK(ddp::exact_sum_exponent(1.0, 33) == 1 - 47);
  CHECK(ddp::exact_sum_exponent(1.0, ddp::kMaxExactTerms) == 1 - 24);  // float32's 24 bits
  CHECK_THROWS_WITH(ddp::exact_sum_exponent(1.0, ddp::kMaxExactTerms + 1),
                    Catch::Contains("exact sum of 536870913 terms"));
  CHECK_THROWS_WITH(ddp::exact_sum_exponent(1.0, 0), Catch::Contains("exact sum of 0 terms"));
  CHECK_THROWS_WITH(ddp::exact_sum_exponent(std::numeric_limits<double>::infinity(), 2),
                    Catch::Contains("largest magnitude is inf"));

  // The most terms at the largest magnitude of their binade sum exactly, to the last bit.
  const float top = std::nextafter(2.0f, 0.0f);  // 2 - 2^-23
  const size_t terms = 64;
  std::vector<float> same(terms, top);
  const int e = ddp::exact_sum_exponent(top, terms);
  double sum = 0;
  ddp::sum_on_grid(same.data(), 1, terms, 1, e, &sum);
  CHECK(std::ldexp(sum, e) == static_cast<double>(top) * terms);
  // float32's largest value: the sum of two overflows float32 as a float32 sum would.
  const float most = std::numeric_limits<float>::max();
  const float pair[2] = {most, most};
  const int e_most = ddp::exact_sum_exponent(most, 2);
  ddp::sum_on_grid(pair, 1, 2, 1, e_most, &sum);
  float out = 0;
  ddp::values_from_grid(&sum, 1, e_most, &out);
  CHECK(std::isinf(out));
  // Subnormal terms keep their bits.
  const float tiny[3] = {std::numeric_limits<float>::denorm_min(),
                         3 * std::numeric_limits<float>::denorm_min(), 0.0f};
  const int e_tiny = ddp::exact_sum_exponent(ddp::max_magnitude(tiny, 3), 3);
  ddp::sum_on_grid(tiny, 1, 3, 1, e_tiny, &sum);
  ddp::values_from_grid(&sum, 1, e_tiny, &out);
  CHECK(out == 4 * std::numeric_limits<float>::denorm_min());
}

TEST_CASE("exact sums: the largest magnitude, infinite where any value is not finite",
          "[exact_sum][bitwise]") {
  const float v[4] = {-3.0f, 2.0f, -0.0f, 1e-40f};
  CHECK(ddp::max_magnitude(v, 4) == 3.0);
  CHECK(ddp::max_magnitude(v, 0) == 0.0);
  const float with_nan[3] = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  CHECK(std::isinf(ddp::max_magnitude(with_nan, 3)));
  const float with_inf[2] = {-std::numeric_limits<float>::infinity(), 2.0f};
  CHECK(std::isinf(ddp::max_magnitude(with_inf, 2)));
}
