// Shared test helpers: element-wise comparison with a relative-error bound that also requires
// every value to be finite, and random fills from the project's deterministic Rng.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/random.h"

namespace ddp_test {

/// REQUIREs |a-b| <= tol·max(1, |b|) for every element, and that both are finite. The elements
/// are checked in a plain loop and only the first bad one goes through Catch (with its index and
/// values): a Catch assertion and message per element cost microseconds, seconds on a vector of
/// a million.
template <typename A, typename B>
void require_close(const A& actual, const B& expected, double tol) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const double a = static_cast<double>(actual[i]);
    const double b = static_cast<double>(expected[i]);
    const double bound = tol * std::fmax(1.0, std::fabs(b));
    if (std::isfinite(a) && std::isfinite(b) && std::fabs(a - b) <= bound) continue;
    INFO("index " << i << ": actual " << a << " expected " << b);
    REQUIRE(std::isfinite(a));
    REQUIRE(std::isfinite(b));
    REQUIRE(std::fabs(a - b) <= bound);
  }
  SUCCEED(expected.size() << " elements within " << tol);
}

inline std::vector<float> random_vector(size_t n, uint64_t seed, double lo = -1.0,
                                        double hi = 1.0) {
  ddp::Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

/// The ddp::Error message `f` throws; "(no error)" when it returns. Other exceptions escape
/// and fail the test (a library exception leaking out is a defect too).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::Error& e) {
    return e.message();
  }
  return "(no error)";
}

}  // namespace ddp_test
