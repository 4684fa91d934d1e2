// The MLP as a whole: finite-difference gradient check of Sequential + softmax cross-entropy,
// the ready hook (each gradient announced once, in reverse registration order, already final),
// PyTorch-default init bounds, and SGD driving the loss down.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/check.h"
#include "comm/reducer.h"
#include "kernels/backend.h"
#include "nn/sequential.h"
#include "test_helpers.h"

namespace {

struct Model {
  ddp::Sequential net;
  ddp::Buffer values, grads;
  Model(const std::vector<int64_t>& widths, int64_t batch, uint64_t seed)
      : net(widths, "relu", batch) {
    size_t total = 0;
    std::vector<size_t> offsets;
    for (size_t n : net.parameter_numels()) {
      offsets.push_back(total);
      total += n;
    }
    values = ddp::Buffer(total);
    grads = ddp::Buffer(total);
    net.bind(values.data(), grads.data(), offsets);
    ddp::Rng rng(seed);
    net.init_uniform(rng);
  }
};

// Mean cross-entropy of the model on (x, y), in double from the float kernel's loss sum.
double loss_of(ddp::Backend& be, Model& m, ddp::Tensor x, const std::vector<int32_t>& y) {
  const ddp::Tensor& logits = m.net.forward(be, x);
  return be.softmax_xent(logits, y.data(), 0.0f, nullptr).loss_sum / static_cast<double>(x.rows);
}

}  // namespace

TEST_CASE("MLP gradients match central finite differences", "[model]") {
  auto be = ddp::make_cpu_backend();
  const int64_t batch = 5;
  Model m({7, 9, 6, 4}, batch, 11);
  auto xs = ddp_test::random_vector(batch * 7, 5);
  ddp::Tensor x{xs.data(), batch, 7};
  std::vector<int32_t> y = {0, 3, 1, 2, 3};

  ddp::Buffer dl(batch * 4);
  const ddp::Tensor& logits = m.net.forward(*be, x);
  ddp::Tensor dlogits = ddp::Tensor::of(dl, batch, 4);
  be->softmax_xent(logits, y.data(), 1.0f / batch, &dlogits);
  m.net.backward(*be, dlogits, false, [](size_t) {});
  std::vector<float> analytic(m.grads.data(), m.grads.data() + m.grads.numel());

  // float32 forward: with h = 1e-3 rounding noise in the loss (~1e-7) gives ~1e-4 in the
  // difference quotient, well below the bound; a step this small rarely crosses a ReLU kink.
  const double h = 1e-3;
  int checked = 0;
  for (size_t i = 0; i < m.values.numel(); ++i) {
    float* p = m.values.data() + i;
    const float saved = *p;
    *p = static_cast<float>(saved + h);
    const double up = loss_of(*be, m, x, y);
    *p = static_cast<float>(saved - h);
    const double down = loss_of(*be, m, x, y);
    *p = saved;
    const double numeric = (up - down) / (2 * h);
    INFO("parameter element " << i << ": analytic " << analytic[i] << " numeric " << numeric);
    REQUIRE(std::fabs(analytic[i] - numeric) <= 1e-3 * std::max(1.0, std::fabs(numeric)));
    ++checked;
  }
  REQUIRE(checked == 7 * 9 + 9 + 9 * 6 + 6 + 6 * 4 + 4);
}

TEST_CASE("backward announces each gradient once, in reverse registration order, when final",
          "[model]") {
  auto be = ddp::make_cpu_backend();
  Model m({6, 8, 8, 3}, 4, 2);
  auto xs = ddp_test::random_vector(4 * 6, 9);
  ddp::Tensor x{xs.data(), 4, 6};
  std::vector<int32_t> y = {0, 1, 2, 1};
  ddp::Buffer dl(4 * 3);
  ddp::Tensor dlogits = ddp::Tensor::of(dl, 4, 3);
  be->softmax_xent(m.net.forward(*be, x), y.data(), 0.25f, &dlogits);

  std::vector<size_t> order;
  std::vector<std::vector<float>> at_hook(m.net.parameters().size());
  m.net.backward(*be, dlogits, false, [&](size_t p) {
    order.push_back(p);
    const ddp::Tensor& g = m.net.parameters()[p]->grad;
    at_hook[p].assign(g.data, g.data + g.numel());
  });
  REQUIRE(order == std::vector<size_t>{5, 4, 3, 2, 1, 0});
  // Nothing written after a hook fired: what the Reducer would have sent is the final gradient.
  for (size_t p = 0; p < order.size(); ++p) {
    const ddp::Tensor& g = m.net.parameters()[p]->grad;
    REQUIRE(at_hook[p] == std::vector<float>(g.data, g.data + g.numel()));
  }
  REQUIRE(m.net.parameter_names() == std::vector<std::string>{"layers.0.weight", "layers.0.bias",
                                                              "layers.1.weight", "layers.1.bias",
                                                              "layers.2.weight", "layers.2.bias"});
}

TEST_CASE("accumulating backward adds to the existing gradients", "[model]") {
  auto be = ddp::make_cpu_backend();
  Model m({5, 7, 3}, 3, 4);
  auto xs = ddp_test::random_vector(3 * 5, 1);
  ddp::Tensor x{xs.data(), 3, 5};
  std::vector<int32_t> y = {2, 0, 1};
  ddp::Buffer dl(9);
  ddp::Tensor dlogits = ddp::Tensor::of(dl, 3, 3);
  be->softmax_xent(m.net.forward(*be, x), y.data(), 1.0f / 3, &dlogits);
  m.net.backward(*be, dlogits, false, [](size_t) {});
  std::vector<float> once(m.grads.data(), m.grads.data() + m.grads.numel());
  m.net.backward(*be, dlogits, true, [](size_t) {});
  for (size_t i = 0; i < once.size(); ++i)
    REQUIRE(m.grads.data()[i] == Approx(2 * once[i]).epsilon(1e-6));
}

TEST_CASE("init is PyTorch's nn.Linear default: U(+-1/sqrt(fan_in)), seeded", "[model]") {
  Model a({100, 50, 10}, 1, 42), b({100, 50, 10}, 1, 42), c({100, 50, 10}, 1, 43);
  REQUIRE(std::equal(a.values.data(), a.values.data() + a.values.numel(), b.values.data()));
  REQUIRE_FALSE(std::equal(a.values.data(), a.values.data() + a.values.numel(), c.values.data()));
  for (const ddp::Parameter* p : a.net.parameters()) {
    const double fan_in = static_cast<double>(p->name.find("layers.0") == 0 ? 100 : 50);
    const double bound = 1.0 / std::sqrt(fan_in);
    double lo = 1, hi = -1;
    for (int64_t i = 0; i < p->numel(); ++i) {
      lo = std::min(lo, static_cast<double>(p->value.data[i]));
      hi = std::max(hi, static_cast<double>(p->value.data[i]));
    }
    INFO(p->name);
    REQUIRE(lo >= -bound);
    REQUIRE(hi <= bound);
    if (p->numel() >= 1000) {  // a large sample spans most of the interval
      REQUIRE(lo < -0.9 * bound);
      REQUIRE(hi > 0.9 * bound);
    }
  }
}

TEST_CASE("forward rejects inputs that do not fit the model", "[model]") {
  auto be = ddp::make_cpu_backend();
  Model m({4, 3}, 2, 1);
  std::vector<float> xs(3 * 5);
  REQUIRE_THROWS_AS(m.net.forward(*be, ddp::Tensor{xs.data(), 2, 5}), ddp::Error);  // width
  REQUIRE_THROWS_AS(m.net.forward(*be, ddp::Tensor{xs.data(), 3, 4}), ddp::Error);  // batch > max
  REQUIRE_THROWS_WITH(ddp::Sequential({4}, "relu", 2), Catch::Contains("model.layers"));
  REQUIRE_THROWS_WITH(ddp::Sequential({4, 2}, "tanh", 2), Catch::Contains("model.activation"));
}
