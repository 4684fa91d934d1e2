// The 16-bit formats of distributed.compression (core/float16.h, comm/compression.h) against an
// independent reference: every code decoded from its fields with ldexp, and rounding checked at
// every boundary between neighbouring codes (the midpoint goes to the even code, the floats
// either side of it to their own side), which covers every float32 input's rounding decision.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/float16.h"
#include "comm/compression.h"

using ddp::Compression;

namespace {

struct Layout {
  Compression format;
  int fraction_bits, exponent_bits;
};
const Layout kLayouts[] = {{Compression::Bf16, 7, 8}, {Compression::Fp16, 10, 5}};

// The value of a code from its sign, exponent and fraction fields (finite codes only).
double reference_value(const Layout& l, uint32_t code) {
  const uint32_t fraction = code & ((1u << l.fraction_bits) - 1);
  const uint32_t exponent = (code >> l.fraction_bits) & ((1u << l.exponent_bits) - 1);
  const int bias = (1 << (l.exponent_bits - 1)) - 1;
  const double magnitude = exponent == 0
                               ? std::ldexp(fraction, 1 - bias - l.fraction_bits)
                               : std::ldexp(fraction + (1u << l.fraction_bits),
                                            static_cast<int>(exponent) - bias - l.fraction_bits);
  return (code & 0x8000u) ? -magnitude : magnitude;
}

uint32_t max_exponent(const Layout& l) { return (1u << l.exponent_bits) - 1; }

uint16_t encode(Compression f, float x) {
  uint16_t h = 0;
  ddp::compress(f, &x, 1, &h);
  return h;
}

float decode(Compression f, uint16_t h) {
  float x = 0;
  ddp::decompress(f, &h, 1, &x);
  return x;
}

bool is_nan_code(const Layout& l, uint32_t code) {
  return ((code >> l.fraction_bits) & max_exponent(l)) == max_exponent(l) &&
         (code & ((1u << l.fraction_bits) - 1)) != 0;
}

}  // namespace

TEST_CASE("16-bit formats: every code decodes exactly and encodes back to itself",
          "[compression]") {
  for (const Layout& l : kLayouts) {
    INFO(ddp::to_string(l.format));
    long wrong = 0;
    for (uint32_t code = 0; code < 0x10000u; ++code) {
      const float x = decode(l.format, static_cast<uint16_t>(code));
      const bool special = ((code >> l.fraction_bits) & max_exponent(l)) == max_exponent(l);
      if (!special) {
        wrong += static_cast<double>(x) != reference_value(l, code);
        wrong += encode(l.format, x) != code;
      } else if (is_nan_code(l, code)) {
        wrong += !std::isnan(x) || !is_nan_code(l, encode(l.format, x));
      } else {
        wrong += !std::isinf(x) || encode(l.format, x) != code;
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("16-bit formats: round to nearest, ties to even, at every boundary", "[compression]") {
  for (const Layout& l : kLayouts) {
    INFO(ddp::to_string(l.format));
    long wrong = 0;
    // Each pair of neighbouring non-negative finite codes, and the largest finite with infinity.
    const uint32_t top = max_exponent(l) << l.fraction_bits;  // +infinity
    for (uint32_t code = 0; code < top; ++code) {
      for (uint32_t sign : {0u, 0x8000u}) {
        const double lo = reference_value(l, code | sign);
        const double hi =
            code + 1 < top
                ? reference_value(l, (code + 1) | sign)
                : (sign ? -1 : 1) * (2 * std::fabs(lo) - std::fabs(reference_value(l, code - 1)));
        const float mid = static_cast<float>((lo + hi) / 2);  // exact: a few more bits
        REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
        const uint32_t even = (code & 1u) ? code + 1 : code;
        const float toward_lo = std::nextafter(mid, static_cast<float>(lo));
        const float toward_hi = std::nextafter(mid, static_cast<float>(hi) * 2);
        wrong += encode(l.format, mid) != (even | sign);
        wrong += encode(l.format, toward_lo) != (code | sign);
        wrong += encode(l.format, toward_hi) != ((code + 1) | sign);
      }
    }
    CHECK(wrong == 0);
  }
  CHECK(encode(Compression::Fp16, 65519.99f) == 0x7bff);  // 65504
  CHECK(encode(Compression::Fp16, 65520.0f) == 0x7c00);   // infinity
  CHECK(encode(Compression::Bf16, std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(encode(Compression::Fp16, std::numeric_limits<float>::denorm_min()) == 0);
  CHECK(encode(Compression::Fp16, -std::numeric_limits<float>::infinity()) == 0xfc00);
}

TEST_CASE("16-bit sums are the exact sum rounded once", "[compression]") {
  std::mt19937 gen(11);
  std::uniform_int_distribution<uint32_t> any(0, 0xffff);
  for (const Layout& l : kLayouts) {
    INFO(ddp::to_string(l.format));
    long wrong = 0, checked = 0;
    std::vector<uint16_t> a(20000), b(20000);
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<uint16_t>(any(gen));
      // Mostly nearby magnitudes, where the sum has bits to round.
      b[i] = static_cast<uint16_t>(i % 2 ? any(gen) : (a[i] ^ (any(gen) & 0x83ffu)));
    }
    std::vector<uint16_t> sum = a;
    ddp::add_compressed(l.format, b.data(), b.size(), sum.data());
    for (size_t i = 0; i < a.size(); ++i) {
      if (is_nan_code(l, a[i]) || is_nan_code(l, b[i])) continue;
      const float x = decode(l.format, a[i]), y = decode(l.format, b[i]);
      if (std::isinf(x) || std::isinf(y)) continue;
      const double exact = static_cast<double>(x) + y;  // exact: both have few bits
      const uint16_t got = sum[i];
      const double value = decode(l.format, got);
      ++checked;
      if (std::isinf(value)) {
        wrong += std::fabs(exact) < reference_value(l, (max_exponent(l) << l.fraction_bits) - 1);
        continue;
      }
      // Nearest: within half the gap to the neighbouring code on exact's side.
      const uint32_t m = got & 0x7fffu;
      const bool outward = std::fabs(exact) > std::fabs(value);
      const uint32_t neighbour = outward || m == 0 ? m + 1 : m - 1;
      const double gap = std::fabs(reference_value(l, neighbour) - std::fabs(value));
      wrong += std::fabs(exact - value) > gap / 2;
      wrong += (exact > 0 && value < 0) || (exact < 0 && value > 0);
    }
    CHECK(checked > 15000);
    CHECK(wrong == 0);
  }
}

TEST_CASE("round_to and add_rounded keep float32 storage with the 16-bit values", "[compression]") {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  std::vector<float> x(1000), y(1000);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = normal(gen);
    y[i] = normal(gen);
  }
  for (const Layout& l : kLayouts) {
    INFO(ddp::to_string(l.format));
    std::vector<float> rx = x, ry = y;
    ddp::round_to(l.format, rx.data(), rx.size());
    ddp::round_to(l.format, ry.data(), ry.size());
    std::vector<uint16_t> hx(x.size()), hy(y.size()), back_x(x.size());
    ddp::compress(l.format, x.data(), x.size(), hx.data());
    ddp::compress(l.format, y.data(), y.size(), hy.data());
    ddp::add_compressed(l.format, hy.data(), hy.size(), hx.data());
    ddp::add_rounded(l.format, ry.data(), ry.size(), rx.data());
    long wrong = 0;
    for (size_t i = 0; i < x.size(); ++i) wrong += rx[i] != decode(l.format, hx[i]);
    CHECK(wrong == 0);
  }
  CHECK(ddp::compressed_value_bytes(Compression::None) == 4);
  CHECK(ddp::compressed_value_bytes(Compression::Bf16) == 2);
  float one = 1.0f;
  uint16_t h = 0;
  CHECK_THROWS(ddp::compress(Compression::None, &one, 1, &h));
}

// distributed.compression_sum float32 against a float64 sum of the ranks' float32 gradients:
// every rank's value rounds once to the format (the wire), the float32 adds round at most
// parts - 1 times at 2^-24, the result once more; the wire's sum instead rounds to the format
// after every addition. Random gradients of mixed signs and magnitudes, 2 to 64 ranks.
TEST_CASE(
    "16-bit values summed in float32: within the stated bound of a float64 sum, nearer "
    "it than the wire's sums",
    "[compression]") {
  std::mt19937 gen(5);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale(-6, 6);
  for (const Layout& l : kLayouts) {
    const double unit = std::ldexp(1.0, -(l.fraction_bits + 1));  // half an ulp, relative
    for (size_t parts : {size_t{2}, size_t{8}, size_t{64}}) {
      const size_t count = 4096;
      std::vector<float> grads(parts * count);
      for (float& g : grads) g = std::ldexp(value(gen), scale(gen));
      std::vector<uint16_t> wire(grads.size());
      ddp::compress(l.format, grads.data(), grads.size(), wire.data());
      std::vector<uint16_t> in_float32(count), in_wire(wire.begin(), wire.begin() + count);
      ddp::sum_in_float32(l.format, wire.data(), parts, count, in_float32.data());
      for (size_t q = 1; q < parts; ++q)
        ddp::add_compressed(l.format, wire.data() + q * count, count, in_wire.data());
      double err32 = 0.0, err_wire = 0.0;
      long beyond = 0;
      for (size_t i = 0; i < count; ++i) {
        double exact = 0.0, magnitudes = 0.0;
        for (size_t q = 0; q < parts; ++q) {
          exact += grads[q * count + i];
          magnitudes += std::fabs(grads[q * count + i]);
        }
        const double got = decode(l.format, in_float32[i]);
        const double e = std::fabs(got - exact);
        // The inputs' roundings, the float32 additions', and the result's.
        const double bound = unit * magnitudes +
                             static_cast<double>(parts - 1) * std::ldexp(1.0, -24) * magnitudes +
                             unit * (std::fabs(exact) + unit * magnitudes);
        beyond += e > bound;
        err32 += e;
        err_wire += std::fabs(decode(l.format, in_wire[i]) - exact);
      }
      INFO(ddp::to_string(l.format)
           << ", " << parts << " ranks: mean |error| against float64 " << err32 / count
           << " summed in float32, " << err_wire / count << " in the wire's type");
      CHECK(beyond == 0);
      if (parts == 2) {
        CHECK(in_float32 == in_wire);  // one addition: both round once
      } else {
        CHECK(err32 < err_wire);
      }
    }
  }
}
