// The CPU backend's kernels against naive double-precision references written here (plain loops),
// against finite differences, and SGD against a transcription of torch.optim.SGD. Outputs are
// pre-filled with NaN so an element a kernel forgets to write fails the comparison.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/check.h"
#include "kernels/backend.h"
#include "test_helpers.h"

namespace {

using Catch::Contains;
using ddp::Tensor;

constexpr double kTol = 1e-5;
constexpr double kFiniteDiffTol = 1e-3;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor view(std::vector<float>& v, int64_t rows, int64_t cols) {
  REQUIRE(static_cast<int64_t>(v.size()) == rows * cols);
  return Tensor{v.data(), rows, cols, ddp::Device::CPU};
}

std::vector<float> nan_vector(int64_t n) {
  return std::vector<float>(static_cast<size_t>(n), kNaN);
}

void require_equal(const std::vector<float>& actual, const std::vector<float>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("index " << i << std::setprecision(9) << ": actual " << actual[i] << " expected "
                  << expected[i]);
    REQUIRE(actual[i] == expected[i]);
  }
}

struct LinearShape {
  int64_t batch, in, out;
};

// Sizes that are multiples of no SIMD width or GEMM block, plus batch 1 and a few random ones.
std::vector<LinearShape> linear_shapes() {
  std::vector<LinearShape> shapes;
  for (int64_t b : {1, 3, 17, 65})
    for (int64_t in : {1, 7, 33, 130})
      for (int64_t out : {1, 3, 17, 65, 130}) shapes.push_back({b, in, out});
  ddp::Rng rng(2024);
  for (int i = 0; i < 6; ++i) {
    shapes.push_back({static_cast<int64_t>(rng.below(150) + 1),
                      static_cast<int64_t>(rng.below(300) + 1),
                      static_cast<int64_t>(rng.below(300) + 1)});
  }
  return shapes;
}

// ---- naive double references -------------------------------------------------------------

std::vector<double> ref_linear_forward(const std::vector<float>& x, const std::vector<float>& w,
                                       const std::vector<float>& bias, const LinearShape& s,
                                       bool relu) {
  std::vector<double> y(static_cast<size_t>(s.batch * s.out));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t o = 0; o < s.out; ++o) {
      double acc = bias[o];
      for (int64_t i = 0; i < s.in; ++i) acc += double(x[b * s.in + i]) * double(w[o * s.in + i]);
      y[b * s.out + o] = relu ? std::max(acc, 0.0) : acc;
    }
  }
  return y;
}

std::vector<double> ref_linear_backward_input(const std::vector<float>& dy,
                                              const std::vector<float>& w,
                                              const std::vector<float>* relu_output,
                                              const LinearShape& s) {
  std::vector<double> dx(static_cast<size_t>(s.batch * s.in));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.in; ++i) {
      double acc = 0.0;
      for (int64_t o = 0; o < s.out; ++o)
        acc += double(dy[b * s.out + o]) * double(w[o * s.in + i]);
      if (relu_output && !((*relu_output)[b * s.in + i] > 0.0f)) acc = 0.0;
      dx[b * s.in + i] = acc;
    }
  }
  return dx;
}

// Returns {dw, db}; starts from the given values so accumulation is the same reference.
std::pair<std::vector<double>, std::vector<double>> ref_linear_backward_params(
    const std::vector<float>& dy, const std::vector<float>& x, const std::vector<float>& dw0,
    const std::vector<float>& db0, const LinearShape& s) {
  std::vector<double> dw(dw0.begin(), dw0.end()), db(db0.begin(), db0.end());
  for (int64_t o = 0; o < s.out; ++o) {
    for (int64_t i = 0; i < s.in; ++i) {
      for (int64_t b = 0; b < s.batch; ++b)
        dw[o * s.in + i] += double(dy[b * s.out + o]) * double(x[b * s.in + i]);
    }
    for (int64_t b = 0; b < s.batch; ++b) db[o] += dy[b * s.out + o];
  }
  return {dw, db};
}

struct XentReference {
  double loss_sum = 0.0;
  int64_t correct = 0;
  std::vector<double> dlogits;
};

XentReference ref_softmax_xent(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                               int64_t classes, double grad_scale) {
  XentReference ref;
  ref.dlogits.resize(logits.size());
  for (size_t r = 0; r < labels.size(); ++r) {
    const float* l = &logits[r * classes];
    int64_t argmax = 0;
    for (int64_t j = 1; j < classes; ++j)
      if (l[j] > l[argmax]) argmax = j;
    double sum = 0.0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(double(l[j]) - double(l[argmax]));
    const double lse = double(l[argmax]) + std::log(sum);
    ref.loss_sum += lse - double(l[labels[r]]);
    ref.correct += argmax == labels[r] ? 1 : 0;
    for (int64_t j = 0; j < classes; ++j) {
      const double onehot = j == labels[r] ? 1.0 : 0.0;
      ref.dlogits[r * classes + j] = (std::exp(double(l[j]) - lse) - onehot) * grad_scale;
    }
  }
  return ref;
}

std::vector<int32_t> random_labels(int64_t n, int64_t classes, uint64_t seed) {
  ddp::Rng rng(seed);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (auto& l : labels) l = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  return labels;
}

std::vector<float> relu_of(std::vector<float> v) {
  for (auto& x : v) x = std::max(x, 0.0f);
  return v;
}

}  // namespace

// ---- linear -------------------------------------------------------------------------------

TEST_CASE("cpu linear_forward matches a double reference, with and without fused relu",
          "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  uint64_t seed = 1;
  for (const auto& s : linear_shapes()) {
    for (bool relu : {false, true}) {
      INFO("batch " << s.batch << " in " << s.in << " out " << s.out << " fuse_relu " << relu);
      auto x = ddp_test::random_vector(s.batch * s.in, seed++);
      auto w = ddp_test::random_vector(s.out * s.in, seed++);
      auto bias = ddp_test::random_vector(s.out, seed++);
      auto y = nan_vector(s.batch * s.out);
      Tensor yt = view(y, s.batch, s.out);
      backend->linear_forward(view(x, s.batch, s.in), view(w, s.out, s.in), view(bias, 1, s.out),
                              relu, yt);
      ddp_test::require_close(y, ref_linear_forward(x, w, bias, s, relu), kTol);
    }
  }
}

TEST_CASE("cpu linear_backward_input matches a double reference, with the relu mask", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  uint64_t seed = 100;
  for (const auto& s : linear_shapes()) {
    for (bool masked : {false, true}) {
      INFO("batch " << s.batch << " in " << s.in << " out " << s.out << " relu mask " << masked);
      auto dy = ddp_test::random_vector(s.batch * s.out, seed++);
      auto w = ddp_test::random_vector(s.out * s.in, seed++);
      // About half the ReLU outputs are exactly zero, as after a real ReLU.
      auto relu_output = relu_of(ddp_test::random_vector(s.batch * s.in, seed++));
      Tensor relu_t = view(relu_output, s.batch, s.in);
      auto dx = nan_vector(s.batch * s.in);
      Tensor dxt = view(dx, s.batch, s.in);
      backend->linear_backward_input(view(dy, s.batch, s.out), view(w, s.out, s.in),
                                     masked ? &relu_t : nullptr, dxt);
      ddp_test::require_close(
          dx, ref_linear_backward_input(dy, w, masked ? &relu_output : nullptr, s), kTol);
    }
  }
}

TEST_CASE("cpu linear_backward_params overwrites or accumulates dw and db", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  uint64_t seed = 200;
  for (const auto& s : linear_shapes()) {
    for (bool accumulate : {false, true}) {
      INFO("batch " << s.batch << " in " << s.in << " out " << s.out << " accumulate "
                    << accumulate);
      auto dy = ddp_test::random_vector(s.batch * s.out, seed++);
      auto x = ddp_test::random_vector(s.batch * s.in, seed++);
      // Accumulation needs defined starting values; overwriting must ignore NaN ones.
      auto dw =
          accumulate ? ddp_test::random_vector(s.out * s.in, seed++) : nan_vector(s.out * s.in);
      auto db = accumulate ? ddp_test::random_vector(s.out, seed++) : nan_vector(s.out);
      const std::vector<float> zero_w(dw.size(), 0.0f), zero_b(db.size(), 0.0f);
      auto ref =
          ref_linear_backward_params(dy, x, accumulate ? dw : zero_w, accumulate ? db : zero_b, s);
      Tensor dwt = view(dw, s.out, s.in), dbt = view(db, 1, s.out);
      backend->linear_backward_params(view(dy, s.batch, s.out), view(x, s.batch, s.in), accumulate,
                                      dwt, dbt);
      ddp_test::require_close(dw, ref.first, kTol);
      ddp_test::require_close(db, ref.second, kTol);
    }
  }
}

namespace {

// sum(y ⊙ r) in double for y = linear_forward(x, w, bias) [then relu]: a scalar objective whose
// gradient with respect to y is exactly r (masked by relu).
double linear_objective(ddp::Backend& backend, std::vector<float>& x, std::vector<float>& w,
                        std::vector<float>& bias, const std::vector<float>& r, const LinearShape& s,
                        bool relu) {
  auto y = nan_vector(s.batch * s.out);
  Tensor yt = view(y, s.batch, s.out);
  backend.linear_forward(view(x, s.batch, s.in), view(w, s.out, s.in), view(bias, 1, s.out), relu,
                         yt);
  double j = 0.0;
  for (size_t i = 0; i < y.size(); ++i) j += double(y[i]) * double(r[i]);
  return j;
}

// Central difference of the objective in one float element, using the step actually taken
// after rounding the perturbed values to float.
template <typename Objective>
double central_difference(std::vector<float>& v, size_t i, float h, Objective objective) {
  const float saved = v[i];
  v[i] = saved + h;
  const double plus_value = v[i];
  const double plus = objective();
  v[i] = saved - h;
  const double minus_value = v[i];
  const double minus = objective();
  v[i] = saved;
  return (plus - minus) / (plus_value - minus_value);
}

}  // namespace

TEST_CASE("cpu linear backward kernels agree with finite differences of the forward", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  const LinearShape s{3, 4, 5};
  for (bool relu : {false, true}) {
    INFO("fuse_relu " << relu);
    auto x = ddp_test::random_vector(s.batch * s.in, 11);
    auto w = ddp_test::random_vector(s.out * s.in, 12);
    auto bias = ddp_test::random_vector(s.out, 13);
    auto r = ddp_test::random_vector(s.batch * s.out, 14);
    const float h = 1e-3f;
    // The objective must be smooth within ±h: no pre-activation may sit that close to the kink.
    auto pre = ref_linear_forward(x, w, bias, s, false);
    for (double z : pre) REQUIRE(std::fabs(z) > 4 * h);

    auto y = nan_vector(s.batch * s.out);
    Tensor yt = view(y, s.batch, s.out);
    backend->linear_forward(view(x, s.batch, s.in), view(w, s.out, s.in), view(bias, 1, s.out),
                            relu, yt);
    auto dy = nan_vector(s.batch * s.out);
    Tensor dyt = view(dy, s.batch, s.out);
    if (relu) {
      backend->relu_backward(view(r, s.batch, s.out), yt, dyt);
    } else {
      dy = r;
    }
    auto dx = nan_vector(s.batch * s.in), dw = nan_vector(s.out * s.in), db = nan_vector(s.out);
    Tensor dxt = view(dx, s.batch, s.in), dwt = view(dw, s.out, s.in), dbt = view(db, 1, s.out);
    backend->linear_backward_input(view(dy, s.batch, s.out), view(w, s.out, s.in), nullptr, dxt);
    backend->linear_backward_params(view(dy, s.batch, s.out), view(x, s.batch, s.in), false, dwt,
                                    dbt);

    auto objective = [&] { return linear_objective(*backend, x, w, bias, r, s, relu); };
    std::vector<double> fd_x, fd_w, fd_b;
    for (size_t i = 0; i < x.size(); ++i) fd_x.push_back(central_difference(x, i, h, objective));
    for (size_t i = 0; i < w.size(); ++i) fd_w.push_back(central_difference(w, i, h, objective));
    for (size_t i = 0; i < bias.size(); ++i)
      fd_b.push_back(central_difference(bias, i, h, objective));
    ddp_test::require_close(dx, fd_x, kFiniteDiffTol);
    ddp_test::require_close(dw, fd_w, kFiniteDiffTol);
    ddp_test::require_close(db, fd_b, kFiniteDiffTol);
  }
}

TEST_CASE("cpu linear kernels reject mismatched shapes and aliasing", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  std::vector<float> a(64, 0.0f), b(64, 0.0f), c(64, 0.0f), d(64, 0.0f);
  Tensor x{a.data(), 2, 3, ddp::Device::CPU};
  Tensor w{b.data(), 4, 3, ddp::Device::CPU};
  Tensor bias{c.data(), 1, 4, ddp::Device::CPU};
  Tensor y{d.data(), 2, 4, ddp::Device::CPU};

  SECTION("forward: w's input width differs from x's") {
    Tensor bad_w{b.data(), 4, 5, ddp::Device::CPU};
    REQUIRE_THROWS_AS(backend->linear_forward(x, bad_w, bias, false, y), ddp::Error);
    REQUIRE_THROWS_WITH(backend->linear_forward(x, bad_w, bias, false, y),
                        Contains("linear_forward") && Contains("x [2, 3]") &&
                            Contains("w [4, 5]") && Contains("bias [1, 4]") &&
                            Contains("y [2, 4]"));
  }
  SECTION("forward: bias and y") {
    Tensor bad_bias{c.data(), 1, 3, ddp::Device::CPU};
    REQUIRE_THROWS_WITH(backend->linear_forward(x, w, bad_bias, false, y), Contains("bias [1, 3]"));
    Tensor bad_y{d.data(), 3, 4, ddp::Device::CPU};
    REQUIRE_THROWS_WITH(backend->linear_forward(x, w, bias, false, bad_y), Contains("y [3, 4]"));
  }
  SECTION("forward: output overlapping an input") {
    Tensor y_on_x{a.data() + 2, 2, 4, ddp::Device::CPU};
    REQUIRE_THROWS_WITH(backend->linear_forward(x, w, bias, false, y_on_x),
                        Contains("output y overlaps input x"));
  }
  SECTION("forward: a tensor on another device") {
    Tensor cuda_w{b.data(), 4, 3, ddp::Device::CUDA};
    REQUIRE_THROWS_WITH(backend->linear_forward(x, cuda_w, bias, false, y),
                        Contains("w is a cuda tensor"));
  }
  SECTION("backward input: dy, dx and relu_output") {
    Tensor bad_dy{d.data(), 2, 5, ddp::Device::CPU};
    Tensor dx{a.data(), 2, 3, ddp::Device::CPU};
    REQUIRE_THROWS_WITH(backend->linear_backward_input(bad_dy, w, nullptr, dx),
                        Contains("linear_backward_input") && Contains("dy [2, 5]") &&
                            Contains("w [4, 3]") && Contains("dx [2, 3]"));
    Tensor bad_dx{a.data(), 2, 4, ddp::Device::CPU};
    REQUIRE_THROWS_WITH(backend->linear_backward_input(y, w, nullptr, bad_dx),
                        Contains("dx [2, 4]"));
    Tensor bad_relu{c.data(), 3, 3, ddp::Device::CPU};
    REQUIRE_THROWS_WITH(backend->linear_backward_input(y, w, &bad_relu, dx),
                        Contains("relu_output [3, 3]"));
  }
  SECTION("backward params: dy, x, dw, db") {
    Tensor dw{a.data(), 4, 3, ddp::Device::CPU};
    Tensor db{c.data(), 1, 4, ddp::Device::CPU};
    Tensor x_in{b.data(), 2, 3, ddp::Device::CPU};
    Tensor bad_x{b.data(), 3, 3, ddp::Device::CPU};
    REQUIRE_THROWS_WITH(
        backend->linear_backward_params(y, bad_x, false, dw, db),
        Contains("linear_backward_params") && Contains("x [3, 3]") && Contains("dy [2, 4]"));
    Tensor bad_dw{a.data(), 3, 4, ddp::Device::CPU};
    REQUIRE_THROWS_WITH(backend->linear_backward_params(y, x_in, false, bad_dw, db),
                        Contains("dw [3, 4]"));
    Tensor bad_db{c.data(), 1, 3, ddp::Device::CPU};
    REQUIRE_THROWS_WITH(backend->linear_backward_params(y, x_in, true, dw, bad_db),
                        Contains("db [1, 3]"));
  }
}

// ---- relu ---------------------------------------------------------------------------------

TEST_CASE("cpu relu forward and backward, out of place and in place", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  uint64_t seed = 300;
  const std::vector<std::pair<int64_t, int64_t>> shapes{
      {1, 1}, {1, 7}, {3, 17}, {17, 130}, {65, 33}};
  for (auto [rows, cols] : shapes) {
    INFO("shape " << ddp::shape_string(rows, cols));
    auto x = ddp_test::random_vector(rows * cols, seed++);
    auto dy = ddp_test::random_vector(rows * cols, seed++);
    std::vector<double> y_ref(x.size()), dx_ref(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      y_ref[i] = std::max(double(x[i]), 0.0);
      dx_ref[i] = x[i] > 0.0f ? double(dy[i]) : 0.0;
    }
    auto y = nan_vector(rows * cols), dx = nan_vector(rows * cols);
    Tensor yt = view(y, rows, cols), dxt = view(dx, rows, cols);
    backend->relu_forward(view(x, rows, cols), yt);
    ddp_test::require_close(y, y_ref, kTol);
    backend->relu_backward(view(dy, rows, cols), yt, dxt);
    ddp_test::require_close(dx, dx_ref, kTol);

    Tensor xt = view(x, rows, cols), dyt = view(dy, rows, cols);
    backend->relu_forward(xt, xt);
    ddp_test::require_close(x, y_ref, kTol);
    backend->relu_backward(dyt, xt, dyt);
    ddp_test::require_close(dy, dx_ref, kTol);
  }
}

TEST_CASE("cpu relu keeps NaN forward and blocks gradients of dead units", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  // Like torch: relu(NaN) is NaN (a diverged run must show), and the backward is a select,
  // so an infinite gradient behind a zero output does not turn into NaN.
  std::vector<float> x{kNaN, -1.0f, 2.0f};
  auto y = nan_vector(3);
  Tensor yt = view(y, 1, 3);
  backend->relu_forward(view(x, 1, 3), yt);
  REQUIRE(std::isnan(y[0]));
  REQUIRE(y[1] == 0.0f);
  REQUIRE(y[2] == 2.0f);
  std::vector<float> out{0.0f, 0.0f, 2.0f};
  std::vector<float> dy{1.0f, std::numeric_limits<float>::infinity(), 3.0f};
  auto dx = nan_vector(3);
  Tensor dxt = view(dx, 1, 3);
  backend->relu_backward(view(dy, 1, 3), view(out, 1, 3), dxt);
  require_equal(dx, {0.0f, 0.0f, 3.0f});
}

TEST_CASE("cpu relu rejects mismatched shapes", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  std::vector<float> a(12), b(12), c(12);
  Tensor x = view(a, 3, 4);
  Tensor y{b.data(), 4, 3, ddp::Device::CPU};
  REQUIRE_THROWS_WITH(backend->relu_forward(x, y),
                      Contains("relu_forward") && Contains("x [3, 4]") && Contains("y [4, 3]"));
  Tensor dx{c.data(), 3, 4, ddp::Device::CPU};
  REQUIRE_THROWS_WITH(backend->relu_backward(x, y, dx),
                      Contains("relu_backward") && Contains("y [4, 3]"));
  REQUIRE_THROWS_WITH(backend->relu_backward(x, x, y), Contains("dx [4, 3]"));
}

// ---- softmax cross-entropy ----------------------------------------------------------------

TEST_CASE("cpu softmax_xent matches a double reference", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  uint64_t seed = 400;
  for (int64_t rows : {1, 3, 64, 130}) {
    for (int64_t classes : {1, 2, 3, 10, 17, 130}) {
      INFO("rows " << rows << " classes " << classes);
      auto logits = ddp_test::random_vector(rows * classes, seed++, -5.0, 5.0);
      auto labels = random_labels(rows, classes, seed++);
      const float grad_scale = 1.0f / static_cast<float>(rows);
      auto ref = ref_softmax_xent(logits, labels, classes, grad_scale);
      auto d = nan_vector(rows * classes);
      Tensor dt = view(d, rows, classes);
      auto result =
          backend->softmax_xent(view(logits, rows, classes), labels.data(), grad_scale, &dt);
      ddp_test::require_close(std::vector<double>{result.loss_sum},
                              std::vector<double>{ref.loss_sum}, kTol);
      REQUIRE(result.correct == ref.correct);
      ddp_test::require_close(d, ref.dlogits, kTol);
      auto no_grad =
          backend->softmax_xent(view(logits, rows, classes), labels.data(), grad_scale, nullptr);
      REQUIRE(no_grad.loss_sum == result.loss_sum);
      REQUIRE(no_grad.correct == result.correct);
    }
  }
}

TEST_CASE("cpu softmax_xent stays finite for huge logits", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  std::vector<float> logits{1000.0f,  -1000.0f, 0.0f,  //
                            1000.0f,  -1000.0f, 0.0f,  //
                            -1000.0f, -1000.0f, -1000.0f};
  std::vector<int32_t> labels{0, 1, 2};
  auto d = nan_vector(9);
  Tensor dt = view(d, 3, 3);
  auto result = backend->softmax_xent(view(logits, 3, 3), labels.data(), 1.0f, &dt);
  REQUIRE(std::isfinite(result.loss_sum));
  // Row losses: 0, 2000 and log 3 (three equal logits).
  REQUIRE(result.loss_sum == Approx(2000.0 + std::log(3.0)).epsilon(1e-6));
  // Row 0 is right; row 1 (label 1) is not; row 2 is a three-way tie won by index 0, not label 2.
  REQUIRE(result.correct == 1);
  const double third = 1.0 / 3.0;
  ddp_test::require_close(d, std::vector<double>{0, 0, 0, 1, -1, 0, third, third, -2 * third},
                          kTol);
}

TEST_CASE("cpu softmax_xent counts a tie as the first maximum", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  std::vector<float> logits{1.0f, 3.0f, 3.0f, 2.0f};
  std::vector<int32_t> second{2}, first{1};
  REQUIRE(backend->softmax_xent(view(logits, 1, 4), second.data(), 1.0f, nullptr).correct == 0);
  REQUIRE(backend->softmax_xent(view(logits, 1, 4), first.data(), 1.0f, nullptr).correct == 1);
}

TEST_CASE("cpu softmax_xent dlogits agree with finite differences of its loss", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  const int64_t rows = 3, classes = 5;
  auto logits = ddp_test::random_vector(rows * classes, 21, -2.0, 2.0);
  auto labels = random_labels(rows, classes, 22);
  const float grad_scale = 1.0f / rows;
  auto d = nan_vector(rows * classes);
  Tensor dt = view(d, rows, classes);
  backend->softmax_xent(view(logits, rows, classes), labels.data(), grad_scale, &dt);
  auto objective = [&] {
    return backend->softmax_xent(view(logits, rows, classes), labels.data(), grad_scale, nullptr)
               .loss_sum *
           double(grad_scale);
  };
  std::vector<double> fd;
  for (size_t i = 0; i < logits.size(); ++i)
    fd.push_back(central_difference(logits, i, 1e-2f, objective));
  ddp_test::require_close(d, fd, kFiniteDiffTol);
}

TEST_CASE("cpu softmax_xent rejects bad labels and shapes", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  std::vector<float> logits(12, 0.0f), d(12);
  Tensor lt = view(logits, 3, 4);
  std::vector<int32_t> too_big{0, 4, 1}, negative{-1, 0, 0};
  REQUIRE_THROWS_AS(backend->softmax_xent(lt, too_big.data(), 1.0f, nullptr), ddp::Error);
  REQUIRE_THROWS_WITH(backend->softmax_xent(lt, too_big.data(), 1.0f, nullptr),
                      Contains("row 1") && Contains("label 4") && Contains("[0, 4)"));
  REQUIRE_THROWS_WITH(backend->softmax_xent(lt, negative.data(), 1.0f, nullptr),
                      Contains("row 0") && Contains("label -1"));
  std::vector<int32_t> good{0, 1, 2};
  Tensor bad_d{d.data(), 4, 3, ddp::Device::CPU};
  REQUIRE_THROWS_WITH(backend->softmax_xent(lt, good.data(), 1.0f, &bad_d),
                      Contains("logits [3, 4]") && Contains("dlogits [4, 3]"));
  REQUIRE_THROWS_WITH(backend->softmax_xent(lt, nullptr, 1.0f, nullptr),
                      Contains("labels is null"));
}

// ---- SGD ----------------------------------------------------------------------------------

namespace {

// ATen's `self.add(other, alpha=a)` on float: vec::fmadd(other, a, self) on the vectorised CPU
// path and a contracted multiply-add under nvcc, i.e. one rounding.
float aten_add(float self, float other, float alpha) { return std::fma(other, alpha, self); }

// torch.optim.SGD's _single_tensor_sgd, transcribed op for op in float32.
void torch_sgd_reference(std::vector<float>& p, const std::vector<float>& grad,
                         std::vector<float>& buf, const ddp::SgdOptions& o, bool first_step) {
  for (size_t i = 0; i < p.size(); ++i) {
    float g = grad[i];
    if (o.weight_decay != 0.0f) g = aten_add(g, p[i], o.weight_decay);
    if (o.momentum != 0.0f) {
      if (first_step) {
        buf[i] = g;  // torch.clone(grad)
      } else {
        buf[i] = buf[i] * o.momentum;                                                 // mul_
        buf[i] = aten_add(buf[i], g, static_cast<float>(1.0 - double(o.dampening)));  // add_
      }
      g = o.nesterov ? aten_add(g, buf[i], o.momentum) : buf[i];
    }
    p[i] = aten_add(p[i], g, -o.lr);
  }
}

// The documented algorithm in double: an independent check of the float transcription.
void sgd_reference_double(std::vector<double>& p, const std::vector<float>& grad,
                          std::vector<double>& buf, const ddp::SgdOptions& o, bool first_step) {
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i];
    if (o.weight_decay != 0.0f) g += double(o.weight_decay) * p[i];
    if (o.momentum != 0.0f) {
      buf[i] = first_step ? g : double(o.momentum) * buf[i] + (1.0 - double(o.dampening)) * g;
      g = o.nesterov ? g + double(o.momentum) * buf[i] : buf[i];
    }
    p[i] -= double(o.lr) * g;
  }
}

void check_sgd_three_steps(ddp::Backend& backend, const ddp::SgdOptions& o) {
  const int64_t n = 37;  // not a multiple of any vector width
  auto params = ddp_test::random_vector(n, 500);
  auto buf = nan_vector(n);  // the first step must not read it; momentum 0 must not touch it
  auto ref_params = params, ref_buf = buf;
  std::vector<double> dbl_params(params.begin(), params.end()), dbl_buf(n, 0.0);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    auto grads = ddp_test::random_vector(n, 510 + step, -2.0, 2.0);
    Tensor pt = view(params, 1, n), bt = view(buf, 1, n);
    backend.sgd_step(pt, view(grads, 1, n), bt, o, step == 0);
    torch_sgd_reference(ref_params, grads, ref_buf, o, step == 0);
    sgd_reference_double(dbl_params, grads, dbl_buf, o, step == 0);
    require_equal(params, ref_params);
    ddp_test::require_close(params, dbl_params, 1e-6);
    if (o.momentum != 0.0f) {
      require_equal(buf, ref_buf);
      ddp_test::require_close(buf, dbl_buf, 1e-6);
    } else {
      for (float b : buf) REQUIRE(std::isnan(b));
    }
  }
}

}  // namespace

TEST_CASE("cpu sgd_step matches torch.optim.SGD exactly for every option combination",
          "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  int combinations = 0;
  for (float momentum : {0.0f, 0.9f})
    for (float dampening : {0.0f, 0.1f})
      for (float weight_decay : {0.0f, 0.01f})
        for (bool nesterov : {false, true}) {
          if (nesterov && !(momentum > 0.0f && dampening == 0.0f)) continue;
          ddp::SgdOptions o;
          o.lr = 0.1f;
          o.momentum = momentum;
          o.dampening = dampening;
          o.weight_decay = weight_decay;
          o.nesterov = nesterov;
          INFO("momentum " << momentum << " dampening " << dampening << " weight_decay "
                           << weight_decay << " nesterov " << nesterov);
          check_sgd_three_steps(*backend, o);
          ++combinations;
        }
  REQUIRE(combinations == 10);
}

TEST_CASE("cpu sgd_step works on flat arrays whose shapes differ but sizes agree", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  std::vector<float> p{1, 2, 3, 4, 5, 6}, g{1, 1, 1, 1, 1, 1}, b(6, kNaN);
  Tensor pt = view(p, 2, 3), bt = view(b, 6, 1);
  ddp::SgdOptions o;
  o.lr = 0.5f;
  o.momentum = 0.9f;
  backend->sgd_step(pt, view(g, 1, 6), bt, o, true);
  require_equal(p, {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f});
  require_equal(b, std::vector<float>(6, 1.0f));
}

TEST_CASE("cpu sgd_step rejects mismatched sizes and illegal nesterov", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  std::vector<float> p(6), g(6), b(6);
  Tensor pt = view(p, 2, 3), bt = view(b, 2, 3);
  Tensor short_g{g.data(), 1, 5, ddp::Device::CPU};
  ddp::SgdOptions o;
  REQUIRE_THROWS_WITH(backend->sgd_step(pt, short_g, bt, o, true),
                      Contains("sgd_step") && Contains("params [2, 3] has 6 elements") &&
                          Contains("grads [1, 5] has 5"));
  o.momentum = 0.9f;
  Tensor short_b{b.data(), 1, 5, ddp::Device::CPU};
  REQUIRE_THROWS_WITH(backend->sgd_step(pt, view(g, 2, 3), short_b, o, true),
                      Contains("momentum_buf [1, 5]"));
  o.nesterov = true;
  o.dampening = 0.1f;
  REQUIRE_THROWS_WITH(backend->sgd_step(pt, view(g, 2, 3), bt, o, true), Contains("nesterov"));
  o.momentum = 0.0f;
  o.dampening = 0.0f;
  REQUIRE_THROWS_WITH(backend->sgd_step(pt, view(g, 2, 3), bt, o, true), Contains("nesterov"));
}

// ---- fill, scale, copy --------------------------------------------------------------------

TEST_CASE("cpu fill, scale and copy", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  REQUIRE(backend->device() == ddp::Device::CPU);
  const int64_t rows = 3, cols = 17;
  auto t = nan_vector(rows * cols);
  Tensor tt = view(t, rows, cols);
  backend->fill(tt, 2.5f);
  require_equal(t, std::vector<float>(t.size(), 2.5f));

  auto v = ddp_test::random_vector(rows * cols, 600);
  auto expected = v;
  for (auto& x : expected) x *= -0.75f;
  Tensor vt = view(v, rows, cols);
  backend->scale(vt, -0.75f);
  require_equal(v, expected);

  auto dst = nan_vector(rows * cols);
  Tensor dt = view(dst, rows, cols);
  backend->copy(vt, dt);
  require_equal(dst, v);
  backend->copy(dt, dt);  // copying a view onto itself is a no-op
  require_equal(dst, v);
}

TEST_CASE("cpu count_nonfinite counts NaN and infinities", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  auto v = ddp_test::random_vector(37, 601);
  CHECK(backend->count_nonfinite(view(v, 1, 37)) == 0);
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[17] = std::numeric_limits<float>::infinity();
  v[36] = -std::numeric_limits<float>::infinity();
  v[5] = std::numeric_limits<float>::max();
  v[6] = std::numeric_limits<float>::denorm_min();
  CHECK(backend->count_nonfinite(view(v, 1, 37)) == 3);
  CHECK(backend->count_nonfinite(Tensor{v.data(), 1, 36, ddp::Device::CPU}) == 2);  // the view only
  CHECK(backend->count_nonfinite(Tensor{v.data(), 0, 5, ddp::Device::CPU}) == 0);
}

TEST_CASE("cpu copy rejects mismatched shapes and partial overlap", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  std::vector<float> a(12), b(12);
  Tensor src = view(a, 3, 4);
  Tensor dst{b.data(), 4, 3, ddp::Device::CPU};
  REQUIRE_THROWS_WITH(backend->copy(src, dst),
                      Contains("copy") && Contains("src [3, 4]") && Contains("dst [4, 3]"));
  Tensor shifted{a.data() + 1, 1, 4, ddp::Device::CPU};
  Tensor head{a.data(), 1, 4, ddp::Device::CPU};
  REQUIRE_THROWS_WITH(backend->copy(head, shifted), Contains("overlaps"));
  Tensor cuda{b.data(), 1, 4, ddp::Device::CUDA};
  REQUIRE_THROWS_WITH(backend->fill(cuda, 0.0f), Contains("fill") && Contains("cuda tensor"));
}
