// The loss scaler against GradScaler's schedule (growth after growth_interval clean steps, backoff
// and reset on an overflow, no growth to inf) and torch's float32 arithmetic (the inverse scale,
// the loss gradient's coefficient).
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "ddp/errors.h"
#include "train/loss_scaler.h"

using ddp::LossScaler;

TEST_CASE("loss scaler: off, the scale is 1 and nothing changes it", "[loss_scale]") {
  LossScaler s(false, 65536.0, 3);
  CHECK(s.scale() == 1.0f);
  CHECK(s.inv_scale() == 1.0f);
  for (int64_t n : {1, 3, 64, 1000, 60000}) CHECK(s.loss_coefficient(n) == 1.0f / n);
  s.update(true);
  s.update(false);
  s.restore(8.0f, 2);
  CHECK(s.scale() == 1.0f);
  CHECK(s.growth_tracker() == 0);
}

TEST_CASE("loss scaler: growth_interval clean steps in a row double the scale", "[loss_scale]") {
  LossScaler s(true, 65536.0, 3);
  CHECK(s.scale() == 65536.0f);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 65536.0f);
  CHECK(s.growth_tracker() == 2);
  s.update(false);
  CHECK(s.scale() == 131072.0f);
  CHECK(s.growth_tracker() == 0);
  for (int i = 0; i < 6; ++i) s.update(false);
  CHECK(s.scale() == 524288.0f);
  LossScaler every(true, 1.0, 1);  // growth_interval 1: every clean step
  for (int i = 0; i < 10; ++i) every.update(false);
  CHECK(every.scale() == 1024.0f);
}

TEST_CASE("loss scaler: an overflow halves the scale and restarts the count", "[loss_scale]") {
  LossScaler s(true, 65536.0, 3);
  s.update(false);
  s.update(false);
  s.update(true);
  CHECK(s.scale() == 32768.0f);
  CHECK(s.growth_tracker() == 0);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 32768.0f);  // the two clean steps before the overflow do not count
  s.update(true);
  s.update(true);
  CHECK(s.scale() == 8192.0f);
  for (int i = 0; i < 3; ++i) s.update(false);
  CHECK(s.scale() == 16384.0f);
  LossScaler odd(true, 3e37, 2000);  // not a power of two: halved in float32, exactly
  odd.update(true);
  CHECK(odd.scale() == 3e37f * 0.5f);
}

// GradScaler grows the scale while it stays finite; here while its inverse stays a normal
// float32 (the compute thread flushes denormals: a subnormal 1/scale would zero the gradients).
TEST_CASE("loss scaler: the scale stays in [2^-126, 2^126]", "[loss_scale]") {
  LossScaler s(true, std::ldexp(1.0, 126), 1);
  s.update(false);
  CHECK(s.scale() == std::ldexp(1.0f, 126));
  CHECK(s.growth_tracker() == 0);
  CHECK(std::isnormal(s.inv_scale()));
  LossScaler p(true, 6e37, 2);  // not a power of two: 1.2e38 would pass 2^126
  p.update(false);
  p.update(false);
  CHECK(p.scale() == 6e37f);
  CHECK(p.growth_tracker() == 0);
  LossScaler q(true, std::ldexp(1.0, -125), 2000);
  q.update(true);
  CHECK(q.scale() == FLT_MIN);  // 2^-126
  CHECK(q.inv_scale() == std::ldexp(1.0f, 126));
  CHECK_THROWS_AS(q.update(true), ddp::CollectiveError);  // every step overflowed, at any scale
  CHECK_THROWS(LossScaler(true, 1e38, 1));
  CHECK_THROWS(LossScaler(true, 1e-39, 1));
  CHECK_THROWS(LossScaler(true, 1.0, 1).restore(1e38f, 0));
}

// torch: inv_scale = scale.double().reciprocal().float(). 53 >= 2 x 24 + 2 bits, so rounding
// the double quotient to float32 is the correctly rounded float32 quotient (double rounding is
// innocuous for division at that precision): the same bits as 1.0f / scale.
TEST_CASE("loss scaler: inv_scale rounds as torch does", "[loss_scale]") {
  CHECK(LossScaler(true, 65536.0, 1).inv_scale() == std::ldexp(1.0f, -16));
  CHECK(LossScaler(true, 3.0, 1).inv_scale() == 0.333333343267440796f);
  CHECK(LossScaler(true, 3e37, 1).inv_scale() == static_cast<float>(1.0 / double(3e37f)));
  float x = 1.0f;
  for (int i = 0; i < 100000; ++i) {
    x = std::nextafter(x * 1.000123f, 2.0f);
    if (x >= 2.0f) x -= 1.0f;
    const LossScaler s(true, x, 1);
    REQUIRE(s.inv_scale() == 1.0f / x);
  }
}

// torch: (loss * scale).backward() gives the mean's backward grad_output = scale, which it
// divides by the sample count in float32. With a power-of-two scale that is exactly the
// unscaled coefficient 1/N times the scale: scaling changes no bit but the exponent.
TEST_CASE("loss scaler: the loss gradient's coefficient is fl(scale / samples)", "[loss_scale]") {
  for (int64_t n : {1, 3, 7, 64, 100, 1000, 60000, 1 << 20}) {
    INFO("samples " << n);
    const float unscaled = 1.0f / static_cast<float>(n);
    CHECK(LossScaler(true, 65536.0, 1).loss_coefficient(n) == 65536.0f * unscaled);
    CHECK(LossScaler(true, std::ldexp(1.0, 100), 1).loss_coefficient(n) ==
          std::ldexp(unscaled, 100));
    CHECK(LossScaler(true, 1000.0, 1).loss_coefficient(n) == 1000.0f / static_cast<float>(n));
  }
  CHECK(LossScaler(true, 1000.0, 1).loss_coefficient(3) == 333.333344f);
}

TEST_CASE("loss scaler: restore continues a checkpoint's schedule", "[loss_scale]") {
  LossScaler s(true, 65536.0, 3);
  s.restore(1024.0f, 2);
  CHECK(s.scale() == 1024.0f);
  CHECK(s.growth_tracker() == 2);
  s.update(false);
  CHECK(s.scale() == 2048.0f);
  CHECK(s.growth_tracker() == 0);
}
