// The CPU's bf16 Linear kernels (src/kernels/cpu/cpu_mixed_linear.h), on oneDNN and on Eigen,
// against a double-precision reference over the same bf16 operands: float32 results within the
// float32 accumulation's bound, bf16 results within that plus half a bf16 ulp of the reference,
// the ReLU and its mask, accumulation, odd shapes, and refusals of wrong views.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/float16.h"
#include "kernels/cpu/cpu_mixed_linear.h"
#include "test_helpers.h"

namespace {

using ddp::Half;
using ddp::Tensor;
using ddp::Tensor16;

/// A rows x cols matrix in bf16 (rounded from random floats) with its float32 and bf16 storage.
struct Bf16Matrix {
  std::vector<float> f32;
  std::vector<uint16_t> bits;
  int64_t rows, cols;
  Bf16Matrix(int64_t r, int64_t c, uint64_t seed, ddp::MixedLinear& k)
      : f32(ddp_test::random_vector(static_cast<size_t>(r * c), seed)),
        bits(static_cast<size_t>(r * c)),
        rows(r),
        cols(c) {
    Tensor16 t = view();
    k.round(Tensor{f32.data(), r, c}, t);
  }
  Tensor16 view() { return Tensor16{bits.data(), rows, cols, ddp::Device::CPU, Half::Bf16}; }
  double at(int64_t r, int64_t c) const { return ddp::bf16_to_float(bits[r * cols + c]); }
};

/// sum_k a(i, k) b(k, j) in double, and the bound on float32's error summing it: k terms, each
/// partial sum rounded once (|error| <= k 2^-24 sum |a||b|, doubled for margin).
struct Dot {
  double value = 0, bound = 0;
};

template <typename A, typename B>
Dot dot(int64_t k, A a, B b) {
  Dot d;
  double magnitude = 0;
  for (int64_t q = 0; q < k; ++q) {
    d.value += a(q) * b(q);
    magnitude += std::fabs(a(q) * b(q));
  }
  d.bound = static_cast<double>(k + 1) * std::ldexp(magnitude, -23);
  return d;
}

double half_ulp_bf16(double v) {
  return v == 0 ? 0 : std::ldexp(1.0, std::ilogb(v) - 8);  // 8 bits of precision, half an ulp
}

std::vector<std::unique_ptr<ddp::MixedLinear>> engines() {
  std::vector<std::unique_ptr<ddp::MixedLinear>> e;
  e.push_back(ddp::cpu::make_bf16_linear_on_eigen());
  e.push_back(ddp::cpu::make_bf16_linear());  // oneDNN where built
  return e;
}

}  // namespace

TEST_CASE("bf16 Linear forward (with and without ReLU) against a double reference",
          "[kernels][bf16]") {
  for (auto& engine : engines()) {
    ddp::MixedLinear& k = *engine;
    INFO(k.describe());
    for (auto [b, in, out] : {std::tuple{1, 1, 1}, {3, 7, 5}, {17, 129, 33}, {64, 784, 256}}) {
      INFO("batch " << b << ", " << in << " -> " << out);
      Bf16Matrix x(b, in, 1, k), w(out, in, 2, k);
      std::vector<float> bias = ddp_test::random_vector(static_cast<size_t>(out), 3);
      std::vector<float> y(static_cast<size_t>(b * out));
      std::vector<uint16_t> y16(y.size());
      Tensor yt{y.data(), b, out};
      Tensor16 y16t{y16.data(), b, out, ddp::Device::CPU, Half::Bf16};
      const Tensor bias_t{bias.data(), 1, out};
      k.forward(x.view(), w.view(), bias_t, yt);
      k.forward_relu(x.view(), w.view(), bias_t, y16t);
      int64_t wrong = 0, negative = 0;
      for (int64_t i = 0; i < b; ++i) {
        for (int64_t j = 0; j < out; ++j) {
          const Dot d = dot(
              in, [&](int64_t q) { return x.at(i, q); }, [&](int64_t q) { return w.at(j, q); });
          const double ref = d.value + bias[j], bound = d.bound + std::ldexp(std::fabs(ref), -23);
          wrong += std::fabs(y[i * out + j] - ref) > bound;
          const double relu = std::max(ref, 0.0);
          const double got = ddp::bf16_to_float(y16[i * out + j]);
          wrong += std::fabs(got - relu) > bound + half_ulp_bf16(relu);
          negative += got < 0;
        }
      }
      CHECK(wrong == 0);
      CHECK(negative == 0);
    }
  }
}

TEST_CASE("bf16 Linear backward: masked input gradient, weight and bias gradients",
          "[kernels][bf16]") {
  for (auto& engine : engines()) {
    ddp::MixedLinear& k = *engine;
    INFO(k.describe());
    for (auto [b, in, out] : {std::tuple{1, 1, 1}, {5, 9, 3}, {33, 70, 129}, {64, 256, 256}}) {
      INFO("batch " << b << ", " << in << " -> " << out);
      Bf16Matrix dy(b, out, 4, k), w(out, in, 5, k), relu_out(b, in, 6, k), x(b, in, 7, k);
      std::vector<uint16_t> dx16(static_cast<size_t>(b * in));
      Tensor16 dx{dx16.data(), b, in, ddp::Device::CPU, Half::Bf16};
      k.backward_input_relu(dy.view(), w.view(), relu_out.view(), dx);
      std::vector<float> dw(static_cast<size_t>(out * in), 0.5f),
          db(static_cast<size_t>(out), 0.25f);
      Tensor dwt{dw.data(), out, in}, dbt{db.data(), 1, out};
      k.backward_params(dy.view(), x.view(), true, dwt, dbt);  // onto 0.5 and 0.25
      int64_t wrong = 0;
      for (int64_t i = 0; i < b; ++i) {
        for (int64_t q = 0; q < in; ++q) {
          const Dot d = dot(
              out, [&](int64_t j) { return dy.at(i, j); }, [&](int64_t j) { return w.at(j, q); });
          const double ref = relu_out.at(i, q) > 0 ? d.value : 0.0;
          const double got = ddp::bf16_to_float(dx16[i * in + q]);
          wrong += std::fabs(got - ref) > d.bound + half_ulp_bf16(ref);
        }
      }
      for (int64_t j = 0; j < out; ++j) {
        const Dot bias_grad = dot(
            b, [&](int64_t i) { return dy.at(i, j); }, [](int64_t) { return 1.0; });
        wrong += std::fabs(db[j] - (0.25 + bias_grad.value)) > bias_grad.bound + 1e-7;
        for (int64_t q = 0; q < in; ++q) {
          const Dot d = dot(
              b, [&](int64_t i) { return dy.at(i, j); }, [&](int64_t i) { return x.at(i, q); });
          wrong += std::fabs(dw[j * in + q] - (0.5 + d.value)) > d.bound + 1e-7;
        }
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("bf16 Linear: views of the wrong shape or format are refused, naming the operand",
          "[kernels][bf16]") {
  auto eigen = ddp::cpu::make_bf16_linear_on_eigen();
  Bf16Matrix x(8, 16, 1, *eigen), w(4, 16, 2, *eigen);
  std::vector<float> bias(4, 0.0f), y(32);
  Tensor yt{y.data(), 8, 4};
  // x [8,16] against w [4,15]: the shapes do not fit.
  Tensor16 narrow = w.view();
  narrow.cols = 15;
  REQUIRE_THROWS_WITH(eigen->forward(x.view(), narrow, Tensor{bias.data(), 1, 4}, yt),
                      Catch::Contains("bf16 forward") && Catch::Contains("do not fit"));
  Tensor16 fp16 = x.view();
  fp16.format = Half::Fp16;
  REQUIRE_THROWS_WITH(eigen->forward(fp16, w.view(), Tensor{bias.data(), 1, 4}, yt),
                      Catch::Contains("x must be bf16"));
}
