// The CPU backend: the kernel conformance suite (tests/support/kernel_conformance.h: every
// kernel against double-precision references, bitwise where the result is exact, in aligned and
// misaligned views), gradients against finite differences, and the argument errors.
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
#include "kernel_conformance.h"
#include "kernels/backend.h"
#include "test_helpers.h"

namespace {

using Catch::Contains;
using ddp::Tensor;
namespace kt = ddp_kernel_test;

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

using kt::LinearShape;

// The conformance shapes, plus every combination of sizes that are multiples of no SIMD width
// or GEMM block, and batch 1.
std::vector<LinearShape> linear_shapes() {
  std::vector<LinearShape> shapes = kt::conformance_linear_shapes(6, 300);
  for (int64_t b : {1, 3, 17, 65})
    for (int64_t in : {1, 7, 33, 130})
      for (int64_t out : {1, 3, 17, 65, 130}) shapes.push_back({b, in, out});
  return shapes;
}

/// Runs conform(target, misaligned) on an aligned and on a misaligned CPU target.
template <typename Conform>
void on_cpu(Conform conform) {
  auto backend = ddp::make_cpu_backend();
  REQUIRE(backend->device() == ddp::Device::CPU);
  kt::KernelTarget target(*backend);
  for (bool misaligned : {false, true}) {
    INFO((misaligned ? "misaligned views" : "aligned views"));
    target.set_misaligned(misaligned);
    conform(target, misaligned);
  }
}

/// Misaligned views take Eigen's unaligned loads, which do not depend on the sizes: the
/// conformance shapes suffice there, the size grid runs aligned (this suite also runs under
/// the sanitizers, where its time is every build's).
std::vector<LinearShape> shapes_for(bool misaligned) {
  return misaligned ? kt::conformance_linear_shapes(6, 300) : linear_shapes();
}

}  // namespace

// ---- conformance ---------------------------------------------------------------------------

TEST_CASE("cpu backend conforms: linear_forward, with and without fused relu", "[kernels]") {
  on_cpu([](kt::KernelTarget& t, bool misaligned) {
    kt::conform_linear_forward(t, shapes_for(misaligned), 1000);
  });
}

TEST_CASE("cpu backend conforms: linear_backward_input, with the relu mask", "[kernels]") {
  on_cpu([](kt::KernelTarget& t, bool misaligned) {
    kt::conform_linear_backward_input(t, shapes_for(misaligned), 2000);
  });
}

TEST_CASE("cpu backend conforms: linear_backward_params overwrites or accumulates", "[kernels]") {
  on_cpu([](kt::KernelTarget& t, bool misaligned) {
    kt::conform_linear_backward_params(t, shapes_for(misaligned), 3000);
  });
}

TEST_CASE("cpu backend conforms: softmax_xent", "[kernels]") {
  std::vector<kt::XentCase> cases;
  for (int64_t rows : {1, 3, 64, 130})
    for (int64_t classes : {1, 2, 3, 10, 17, 130, 1500}) cases.push_back({rows, classes, true});
  on_cpu([&](kt::KernelTarget& t, bool misaligned) {
    const std::vector<kt::XentCase> one_row(cases.begin(), cases.begin() + 7);  // every width
    kt::conform_softmax_xent(t, misaligned ? one_row : cases, 6000);
    kt::conform_softmax_xent_extremes(t);
  });
}

TEST_CASE("cpu backend conforms: sgd_step is torch.optim.SGD for every option combination",
          "[kernels]") {
  REQUIRE(kt::sgd_option_combinations().size() == 10);
  on_cpu([](kt::KernelTarget& t, bool) {
    for (int64_t n : {1, 3, 4, 9, 37, 1027}) kt::conform_sgd_step(t, n, 8000);
  });
}

TEST_CASE("cpu backend conforms: adam_step is torch.optim.Adam and AdamW for every option",
          "[kernels]") {
  REQUIRE(kt::adam_cases().size() == 9);
  on_cpu([](kt::KernelTarget& t, bool) {
    for (int64_t n : {1, 3, 4, 9, 37, 1027}) kt::conform_adam_step(t, n, 9000);
  });
}

TEST_CASE("cpu backend conforms: relu, fill, scale, copy, count_nonfinite", "[kernels]") {
  on_cpu([](kt::KernelTarget& t, bool) {
    uint64_t seed = 9000;
    for (const auto& [rows, cols] : kt::conformance_elementwise_shapes(true)) {
      kt::conform_relu(t, rows, cols, seed += 10);
      kt::conform_fill_scale_copy(t, rows, cols, seed += 10);
      kt::conform_count_nonfinite(t, rows, cols, seed += 10);
    }
  });
}

// ---- finite differences --------------------------------------------------------------------

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
    const kt::LinearData d = kt::make_linear_data(s, 11);
    auto x = d.x, w = d.w, bias = d.bias;
    auto r = ddp_test::random_vector(s.batch * s.out, 14);
    const float h = 1e-3f;
    // The objective must be smooth within ±h: no pre-activation may sit that close to the kink.
    for (double z : kt::ref_forward(d, false).value) REQUIRE(std::fabs(z) > 4 * h);

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

// ---- argument errors and edge cases --------------------------------------------------------

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

TEST_CASE("cpu softmax_xent dlogits agree with finite differences of its loss", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  const int64_t rows = 3, classes = 5;
  auto logits = ddp_test::random_vector(rows * classes, 21, -2.0, 2.0);
  auto labels = kt::random_labels(rows, classes, 22);
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

TEST_CASE("cpu backend captures no graphs and says so by name", "[kernels]") {
  auto backend = ddp::make_cpu_backend();
  REQUIRE_FALSE(backend->captures_graphs());
  REQUIRE_THROWS_WITH(backend->begin_graph(), Contains("the cpu backend captures no graphs") &&
                                                  Contains("training.cuda_graphs is for GPUs"));
  REQUIRE_THROWS_WITH(backend->end_graph(), Contains("the cpu backend captures no graphs"));
}
