// The CUDA kernels against double-precision references and the CPU backend (ragged, batch-1 and
// vector-friendly shapes), every GEMM plan, plan choice, determinism and argument errors. Outputs
// are NaN-poisoned and guarded, so a skipped element or a store past a view's end fails.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <limits>
#include <set>
#include <vector>

#include "cuda_test_support.h"

namespace {

using ddp::Backend;
using ddp::GemmPlan;
using ddp::Tensor;
using ddp_cuda_test::DeviceTensor;
using ddp_cuda_test::ForcedGemmPlan;
using ddp_cuda_test::host_view;
using ddp_cuda_test::kEmulated;
using ddp_cuda_test::kGuard;
using ddp_cuda_test::kNaN;
using ddp_cuda_test::kTol;
using ddp_cuda_test::random_floats;
using ddp_cuda_test::random_labels;
using ddp_cuda_test::require_accurate;
using ddp_cuda_test::require_bitwise_equal;
using ddp_cuda_test::require_error;
using ddp_cuda_test::require_guards_intact;

std::unique_ptr<Backend> make_cuda() { return ddp::make_cuda_backend(0); }

// ---- Linear layer products ---------------------------------------------------------------

struct LinearShape {
  int64_t batch, in, out;
};

std::string describe(const LinearShape& s) {
  std::ostringstream oss;
  oss << "batch " << s.batch << ", in " << s.in << ", out " << s.out;
  return oss.str();
}

// Ragged sizes (multiples of no vector width or tile edge), batch 1, sizes whose every GEMM
// extent is a multiple of 4 (the 16-byte path), and a few random ones.
std::vector<LinearShape> linear_shapes() {
  std::vector<LinearShape> shapes = {{1, 1, 1},   {1, 5, 3},    {1, 64, 12}, {3, 7, 5},
                                     {17, 33, 9}, {13, 70, 45}, {8, 16, 12}, {20, 132, 36},
                                     {37, 4, 4},  {6, 130, 129}};
  ddp::Rng rng(77);
  const uint64_t limit = kEmulated ? 80 : 700;
  for (int i = 0; i < 3; ++i) {
    shapes.push_back({static_cast<int64_t>(rng.below(limit) + 1),
                      static_cast<int64_t>(rng.below(limit) + 1),
                      static_cast<int64_t>(rng.below(limit) + 1)});
  }
  if (!kEmulated) {
    shapes.insert(shapes.end(), {{256, 784, 256},
                                 {256, 256, 10},
                                 {1, 1024, 1024},
                                 {64, 4096, 64},
                                 {129, 257, 65},
                                 {1000, 333, 517},
                                 {512, 512, 512}});
  }
  return shapes;
}

struct LinearData {
  LinearShape s;
  std::vector<float> x, w, bias, dy, relu_out, dw0, db0;
};

LinearData make_linear_data(const LinearShape& s, uint64_t seed) {
  LinearData d;
  d.s = s;
  d.x = random_floats(static_cast<size_t>(s.batch * s.in), seed);
  d.w = random_floats(static_cast<size_t>(s.out * s.in), seed + 1, -0.5, 0.5);
  d.bias = random_floats(static_cast<size_t>(s.out), seed + 2);
  d.dy = random_floats(static_cast<size_t>(s.batch * s.out), seed + 3);
  d.relu_out = random_floats(static_cast<size_t>(s.batch * s.in), seed + 4);
  for (float& v : d.relu_out) v = v < 0.0f ? 0.0f : v;  // about half of the units dead
  d.dw0 = random_floats(static_cast<size_t>(s.out * s.in), seed + 5);
  d.db0 = random_floats(static_cast<size_t>(s.out), seed + 6);
  return d;
}

/// Reference values in double and each element's condition (sum of |terms|).
struct Reference {
  std::vector<double> value, cond;
};

Reference ref_forward(const LinearData& d, bool relu) {
  const LinearShape& s = d.s;
  Reference r;
  r.value.resize(static_cast<size_t>(s.batch * s.out));
  r.cond.resize(r.value.size());
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t o = 0; o < s.out; ++o) {
      double acc = d.bias[o], cond = std::fabs(double(d.bias[o]));
      for (int64_t i = 0; i < s.in; ++i) {
        const double t = double(d.x[b * s.in + i]) * double(d.w[o * s.in + i]);
        acc += t;
        cond += std::fabs(t);
      }
      r.value[b * s.out + o] = relu ? std::max(acc, 0.0) : acc;
      r.cond[b * s.out + o] = cond;
    }
  }
  return r;
}

Reference ref_backward_input(const LinearData& d, bool mask) {
  const LinearShape& s = d.s;
  Reference r;
  r.value.resize(static_cast<size_t>(s.batch * s.in));
  r.cond.resize(r.value.size());
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.in; ++i) {
      double acc = 0.0, cond = 0.0;
      for (int64_t o = 0; o < s.out; ++o) {
        const double t = double(d.dy[b * s.out + o]) * double(d.w[o * s.in + i]);
        acc += t;
        cond += std::fabs(t);
      }
      // A dead unit's gradient is exactly 0 (a select): condition 0 demands it exactly.
      if (mask && !(d.relu_out[b * s.in + i] > 0.0f)) acc = cond = 0.0;
      r.value[b * s.in + i] = acc;
      r.cond[b * s.in + i] = cond;
    }
  }
  return r;
}

/// {dw, db}, starting from dw0/db0 when accumulating.
std::pair<Reference, Reference> ref_backward_params(const LinearData& d, bool accumulate) {
  const LinearShape& s = d.s;
  Reference dw, db;
  dw.value.resize(static_cast<size_t>(s.out * s.in));
  dw.cond.resize(dw.value.size());
  db.value.resize(static_cast<size_t>(s.out));
  db.cond.resize(db.value.size());
  for (int64_t o = 0; o < s.out; ++o) {
    for (int64_t i = 0; i < s.in; ++i) {
      double acc = accumulate ? d.dw0[o * s.in + i] : 0.0;
      double cond = std::fabs(acc);
      for (int64_t b = 0; b < s.batch; ++b) {
        const double t = double(d.dy[b * s.out + o]) * double(d.x[b * s.in + i]);
        acc += t;
        cond += std::fabs(t);
      }
      dw.value[o * s.in + i] = acc;
      dw.cond[o * s.in + i] = cond;
    }
    double acc = accumulate ? d.db0[o] : 0.0;
    double cond = std::fabs(acc);
    for (int64_t b = 0; b < s.batch; ++b) {
      acc += d.dy[b * s.out + o];
      cond += std::fabs(double(d.dy[b * s.out + o]));
    }
    db.value[o] = acc;
    db.cond[o] = cond;
  }
  return {dw, db};
}

// The kernels on the CUDA backend: inputs uploaded, outputs poisoned (or preset when
// accumulating), guards checked, results downloaded.
std::vector<float> cuda_forward(Backend& be, const LinearData& d, bool relu) {
  const LinearShape& s = d.s;
  DeviceTensor x(d.x, s.batch, s.in), w(d.w, s.out, s.in), bias(d.bias, 1, s.out);
  DeviceTensor y(s.batch, s.out);
  be.fill(y.view(), kNaN);
  be.linear_forward(x.view(), w.view(), bias.view(), relu, y.view());
  require_guards_intact(y, "linear_forward y");
  return y.download();
}

std::vector<float> cuda_backward_input(Backend& be, const LinearData& d, bool mask) {
  const LinearShape& s = d.s;
  DeviceTensor dy(d.dy, s.batch, s.out), w(d.w, s.out, s.in), relu_out(d.relu_out, s.batch, s.in);
  DeviceTensor dx(s.batch, s.in);
  be.fill(dx.view(), kNaN);
  be.linear_backward_input(dy.view(), w.view(), mask ? &relu_out.view() : nullptr, dx.view());
  require_guards_intact(dx, "linear_backward_input dx");
  return dx.download();
}

std::pair<std::vector<float>, std::vector<float>> cuda_backward_params(Backend& be,
                                                                       const LinearData& d,
                                                                       bool accumulate) {
  const LinearShape& s = d.s;
  DeviceTensor dy(d.dy, s.batch, s.out), x(d.x, s.batch, s.in);
  DeviceTensor dw(d.dw0, s.out, s.in), db(d.db0, 1, s.out);
  if (!accumulate) {
    be.fill(dw.view(), kNaN);
    be.fill(db.view(), kNaN);
  }
  be.linear_backward_params(dy.view(), x.view(), accumulate, dw.view(), db.view());
  require_guards_intact(dw, "linear_backward_params dw");
  require_guards_intact(db, "linear_backward_params db");
  return {dw.download(), db.download()};
}

// The same on the CPU backend.
std::vector<float> cpu_forward(Backend& cpu, const LinearData& d, bool relu) {
  const LinearShape& s = d.s;
  std::vector<float> y(static_cast<size_t>(s.batch * s.out), kNaN);
  Tensor yv = host_view(y, s.batch, s.out);
  cpu.linear_forward(host_view(d.x, s.batch, s.in), host_view(d.w, s.out, s.in),
                     host_view(d.bias, 1, s.out), relu, yv);
  return y;
}

std::vector<float> cpu_backward_input(Backend& cpu, const LinearData& d, bool mask) {
  const LinearShape& s = d.s;
  std::vector<float> dx(static_cast<size_t>(s.batch * s.in), kNaN);
  Tensor dxv = host_view(dx, s.batch, s.in);
  const Tensor relu_out = host_view(d.relu_out, s.batch, s.in);
  cpu.linear_backward_input(host_view(d.dy, s.batch, s.out), host_view(d.w, s.out, s.in),
                            mask ? &relu_out : nullptr, dxv);
  return dx;
}

std::pair<std::vector<float>, std::vector<float>> cpu_backward_params(Backend& cpu,
                                                                      const LinearData& d,
                                                                      bool accumulate) {
  const LinearShape& s = d.s;
  std::vector<float> dw = accumulate ? d.dw0 : std::vector<float>(d.dw0.size(), kNaN);
  std::vector<float> db = accumulate ? d.db0 : std::vector<float>(d.db0.size(), kNaN);
  Tensor dwv = host_view(dw, s.out, s.in), dbv = host_view(db, 1, s.out);
  cpu.linear_backward_params(host_view(d.dy, s.batch, s.out), host_view(d.x, s.batch, s.in),
                             accumulate, dwv, dbv);
  return {dw, db};
}

// CUDA against the reference, the CPU backend against the same reference (so a wrong reference
// shows up as such), and CUDA against the CPU backend.
void require_all_agree(const std::vector<float>& cuda, const std::vector<float>& cpu,
                       const Reference& ref, const std::string& what) {
  require_accurate(cuda, ref.value, ref.cond, what + ": cuda vs double reference");
  require_accurate(cpu, ref.value, ref.cond, what + ": cpu vs double reference");
  require_accurate(cuda, cpu, ref.cond, what + ": cuda vs cpu backend");
}

TEST_CASE("cuda linear_forward matches a double reference and the CPU backend", DDP_CUDA_TAGS) {
  auto be = make_cuda();
  auto cpu = ddp::make_cpu_backend();
  uint64_t seed = 1000;
  for (const LinearShape& s : linear_shapes()) {
    const LinearData d = make_linear_data(s, seed += 10);
    for (bool relu : {false, true}) {
      INFO(describe(s) << (relu ? ", fused relu" : ""));
      require_all_agree(cuda_forward(*be, d, relu), cpu_forward(*cpu, d, relu),
                        ref_forward(d, relu), "linear_forward");
    }
  }
}

TEST_CASE("cuda linear_backward_input matches a double reference and the CPU backend",
          DDP_CUDA_TAGS) {
  auto be = make_cuda();
  auto cpu = ddp::make_cpu_backend();
  uint64_t seed = 2000;
  for (const LinearShape& s : linear_shapes()) {
    const LinearData d = make_linear_data(s, seed += 10);
    for (bool mask : {false, true}) {
      INFO(describe(s) << (mask ? ", relu_output mask" : ""));
      require_all_agree(cuda_backward_input(*be, d, mask), cpu_backward_input(*cpu, d, mask),
                        ref_backward_input(d, mask), "linear_backward_input");
    }
  }
}

TEST_CASE("cuda linear_backward_params matches a double reference and the CPU backend",
          DDP_CUDA_TAGS) {
  auto be = make_cuda();
  auto cpu = ddp::make_cpu_backend();
  uint64_t seed = 3000;
  for (const LinearShape& s : linear_shapes()) {
    const LinearData d = make_linear_data(s, seed += 10);
    for (bool accumulate : {false, true}) {
      INFO(describe(s) << (accumulate ? ", accumulate" : ""));
      const auto ref = ref_backward_params(d, accumulate);
      const auto got = cuda_backward_params(*be, d, accumulate);
      const auto want = cpu_backward_params(*cpu, d, accumulate);
      require_all_agree(got.first, want.first, ref.first, "linear_backward_params dw");
      require_all_agree(got.second, want.second, ref.second, "linear_backward_params db");
    }
  }
}

// ---- GEMM plans --------------------------------------------------------------------------

enum class Product { kForward, kBackwardInput, kBackwardParams };

const char* product_name(Product p) {
  return p == Product::kForward         ? "linear_forward"
         : p == Product::kBackwardInput ? "linear_backward_input"
                                        : "linear_backward_params";
}

// The layer shape whose `p` product is an m x n x k GEMM.
LinearShape shape_for(Product p, int64_t m, int64_t n, int64_t k) {
  switch (p) {
    case Product::kForward:
      return {m, k, n};
    case Product::kBackwardInput:
      return {m, n, k};
    default:
      return {k, n, m};
  }
}

TEST_CASE("cuda every GEMM plan computes all three products of a Linear layer", DDP_CUDA_TAGS) {
  auto be = make_cuda();
  for (Product product : {Product::kForward, Product::kBackwardInput, Product::kBackwardParams}) {
    // K above 128, so a 3-way split really makes three K slices (a slice is a multiple of 64
    // long) with a ragged last one. The first shape is ragged (a vectorized request falls back
    // to scalar access), the second a multiple of 4 in every extent.
    std::vector<LinearShape> shapes = {shape_for(product, 37, 45, 133),
                                       shape_for(product, 36, 44, 136)};
    if (!kEmulated) {
      shapes.push_back(shape_for(product, 300, 270, 389));
      shapes.push_back(shape_for(product, 300, 268, 388));
    }
    for (size_t si = 0; si < shapes.size(); ++si) {
      const LinearData d = make_linear_data(shapes[si], 4000 + 10 * si);
      Reference ref[2][2];  // [epilogue][0: dw or y or dx, 1: db]
      for (int e = 0; e < 2; ++e) {
        if (product == Product::kForward) {
          ref[e][0] = ref_forward(d, e == 1);
        } else if (product == Product::kBackwardInput) {
          ref[e][0] = ref_backward_input(d, e == 1);
        } else {
          std::tie(ref[e][0], ref[e][1]) = ref_backward_params(d, e == 1);
        }
      }
      for (int tile = 0; tile < 3; ++tile) {
        for (int splits : {1, 3}) {
          for (bool vectorized : {false, true}) {
            GemmPlan plan;
            plan.tile = tile;
            plan.splits = splits;
            plan.vectorized = vectorized;
            // The fused epilogue (relu, mask or accumulate) is on for half the plans of one
            // shape and for the other half of the other.
            const int e = (tile + (splits > 1) + vectorized + static_cast<int>(si)) % 2;
            INFO(product_name(product)
                 << ", " << describe(shapes[si]) << "; plan tile " << tile << ", splits " << splits
                 << ", vectorized " << vectorized << "; epilogue " << e);
            ForcedGemmPlan forced(*be, plan);
            if (product == Product::kForward) {
              require_accurate(cuda_forward(*be, d, e == 1), ref[e][0].value, ref[e][0].cond, "y");
            } else if (product == Product::kBackwardInput) {
              require_accurate(cuda_backward_input(*be, d, e == 1), ref[e][0].value, ref[e][0].cond,
                               "dx");
            } else {
              const auto got = cuda_backward_params(*be, d, e == 1);
              require_accurate(got.first, ref[e][0].value, ref[e][0].cond, "dw");
              require_accurate(got.second, ref[e][1].value, ref[e][1].cond, "db");
            }
          }
        }
      }
    }
  }
}

TEST_CASE("cuda plan_gemm is a pure choice within its documented limits", DDP_CUDA_TAGS) {
  SECTION("a big product takes the biggest tile, unsplit") {
    const GemmPlan plan = ddp::plan_gemm(4096, 4096, 4096, 132, true);
    CHECK(plan.tile == 0);
    CHECK(plan.splits == 1);
    CHECK(plan.vectorized);
  }
  SECTION("a tiny product with a long K is split") {
    const GemmPlan plan = ddp::plan_gemm(32, 32, 8192, 132, false);
    CHECK(plan.splits > 1);
    CHECK(plan.splits <= 8192 / 256);
    CHECK_FALSE(plan.vectorized);
  }
  SECTION("every plan is valid, deterministic and splits K into slices of >= 256") {
    for (int64_t m : {1, 7, 32, 100, 257, 1000, 5000}) {
      for (int64_t n : {1, 10, 64, 129, 784, 4096}) {
        for (int64_t k : {1, 100, 255, 256, 511, 512, 1024, 4096, 100000}) {
          for (int sms : {1, 4, 80, 132}) {
            for (bool vec : {false, true}) {
              const GemmPlan a = ddp::plan_gemm(m, n, k, sms, vec);
              const GemmPlan b = ddp::plan_gemm(m, n, k, sms, vec);
              INFO("m " << m << " n " << n << " k " << k << " sms " << sms << " vec " << vec
                        << ": tile " << a.tile << " splits " << a.splits);
              REQUIRE((a.tile >= 0 && a.tile <= 2));
              REQUIRE(a.splits >= 1);
              REQUIRE((a.splits == 1 || a.splits <= k / 256));
              REQUIRE(a.vectorized == vec);
              REQUIRE((a.tile == b.tile && a.splits == b.splits && a.vectorized == b.vectorized));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("cuda GEMMs and reductions are bitwise reproducible", DDP_CUDA_TAGS) {
  auto be = make_cuda();
  // A long K: on a real device the automatic plan splits it.
  const LinearShape s = kEmulated ? LinearShape{67, 300, 45} : LinearShape{256, 4096, 100};
  const LinearData d = make_linear_data(s, 5000);
  auto run_twice = [&] {
    require_bitwise_equal(cuda_forward(*be, d, true), cuda_forward(*be, d, true),
                          "linear_forward twice");
    require_bitwise_equal(cuda_backward_input(*be, d, true), cuda_backward_input(*be, d, true),
                          "linear_backward_input twice");
    const auto first = cuda_backward_params(*be, d, false);
    const auto second = cuda_backward_params(*be, d, false);
    require_bitwise_equal(second.first, first.first, "linear_backward_params dw twice");
    require_bitwise_equal(second.second, first.second, "linear_backward_params db twice");
  };
  SECTION("automatic plan") { run_twice(); }
  SECTION("forced split-K plan") {
    GemmPlan plan;
    plan.tile = 1;
    plan.splits = 3;
    plan.vectorized = true;
    ForcedGemmPlan forced(*be, plan);
    run_twice();
    const Reference ref = ref_forward(d, true);
    require_accurate(cuda_forward(*be, d, true), ref.value, ref.cond, "split linear_forward");
  }
}

// ---- softmax cross-entropy ---------------------------------------------------------------

struct XentReference {
  double loss_sum = 0.0, loss_cond = 0.0;
  int64_t correct = 0;
  Reference dlogits;
};

// Uniform logits, plus rows that test the first-maximum rule (row 0: all equal; row 1: the
// maximum twice, label on the second) and stability (row 2: shifted by +60).
std::vector<float> make_logits(int64_t rows, int64_t classes, uint64_t seed) {
  std::vector<float> l = random_floats(static_cast<size_t>(rows * classes), seed, -4.0, 4.0);
  if (rows > 0)
    for (int64_t c = 0; c < classes; ++c) l[c] = 0.5f;
  if (rows > 1 && classes >= 3) l[classes + 1] = l[classes + 2] = 9.0f;
  if (rows > 2)
    for (int64_t c = 0; c < classes; ++c) l[2 * classes + c] += 60.0f;
  return l;
}

std::vector<int32_t> make_xent_labels(int64_t rows, int64_t classes, uint64_t seed) {
  std::vector<int32_t> labels = random_labels(rows, classes, seed);
  if (rows > 0) labels[0] = 0;
  if (rows > 1 && classes >= 3) labels[1] = 2;
  return labels;
}

XentReference ref_xent(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                       int64_t classes, double grad_scale) {
  XentReference ref;
  ref.dlogits.value.resize(logits.size());
  ref.dlogits.cond.resize(logits.size());
  for (size_t r = 0; r < labels.size(); ++r) {
    const float* l = &logits[r * classes];
    int64_t argmax = 0;
    for (int64_t j = 1; j < classes; ++j)
      if (l[j] > l[argmax]) argmax = j;
    const double max = l[argmax];
    double sum = 0.0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(double(l[j]) - max);
    const double lse = max + std::log(sum);
    const double label_logit = l[labels[r]];
    ref.loss_sum += lse - label_logit;
    ref.loss_cond += std::fabs(lse) + std::fabs(label_logit) + 1.0;
    ref.correct += argmax == labels[r] ? 1 : 0;
    for (int64_t j = 0; j < classes; ++j) {
      const double p = std::exp(double(l[j]) - lse);
      const double onehot = j == labels[r] ? 1.0 : 0.0;
      ref.dlogits.value[r * classes + j] = (p - onehot) * grad_scale;
      // p = exp(l - lse): an error in the exponent's operands is a relative error in p.
      ref.dlogits.cond[r * classes + j] =
          std::fabs(grad_scale) * (p * (1.0 + std::fabs(lse) + std::fabs(double(l[j]))) + onehot);
    }
  }
  return ref;
}

enum class DlogitsMode { kSeparate, kNone, kAliased };

struct XentOutput {
  ddp::XentResult result;
  std::vector<float> dlogits;  // empty for kNone
};

XentOutput cuda_xent(Backend& be, const std::vector<float>& logits,
                     const std::vector<int32_t>& labels, int64_t classes, float grad_scale,
                     DlogitsMode mode) {
  const int64_t rows = static_cast<int64_t>(labels.size());
  DeviceTensor l(logits, rows, classes);
  ddp::DeviceArray<int32_t> device_labels(labels.size());
  device_labels.upload(labels.data(), labels.size());
  XentOutput out;
  if (mode == DlogitsMode::kSeparate) {
    DeviceTensor d(rows, classes);
    be.fill(d.view(), kNaN);
    out.result = be.softmax_xent(l.view(), device_labels.data(), grad_scale, &d.view());
    require_guards_intact(d, "dlogits");
    out.dlogits = d.download();
    require_bitwise_equal(l.download(), logits, "logits are an input only");
  } else if (mode == DlogitsMode::kAliased) {
    out.result = be.softmax_xent(l.view(), device_labels.data(), grad_scale, &l.view());
    out.dlogits = l.download();
  } else {
    out.result = be.softmax_xent(l.view(), device_labels.data(), grad_scale, nullptr);
    require_bitwise_equal(l.download(), logits, "logits are an input only");
  }
  require_guards_intact(l, "logits");
  return out;
}

XentOutput cpu_xent(Backend& cpu, std::vector<float> logits, const std::vector<int32_t>& labels,
                    int64_t classes, float grad_scale, DlogitsMode mode) {
  const int64_t rows = static_cast<int64_t>(labels.size());
  Tensor l = host_view(logits, rows, classes);
  XentOutput out;
  if (mode == DlogitsMode::kSeparate) {
    out.dlogits.assign(logits.size(), kNaN);
    Tensor d = host_view(out.dlogits, rows, classes);
    out.result = cpu.softmax_xent(l, labels.data(), grad_scale, &d);
  } else if (mode == DlogitsMode::kAliased) {
    out.result = cpu.softmax_xent(l, labels.data(), grad_scale, &l);
    out.dlogits = logits;
  } else {
    out.result = cpu.softmax_xent(l, labels.data(), grad_scale, nullptr);
  }
  return out;
}

TEST_CASE("cuda softmax_xent matches a double reference and the CPU backend", DDP_CUDA_TAGS) {
  auto be = make_cuda();
  auto cpu = ddp::make_cpu_backend();
  struct Case {
    int64_t rows, classes;
    bool every_dlogits_mode;
  };
  // Every register-cached width (1 to 32 values per lane) and the generic path (> 1024).
  std::vector<Case> cases;
  for (int64_t classes : {1, 2, 10, 33, 100, 200, 500, 1024, 1500}) {
    const int64_t rows = kEmulated ? (classes <= 100   ? 21
                                      : classes <= 500 ? 19
                                                       : 9)
                                   : (classes <= 1024 ? 1000 : 500);
    cases.push_back({rows, classes, true});
  }
  // Batch 1, and more rows than the totals pass has threads (for the totals one mode does).
  cases.insert(cases.end(), {{1, 10, true}, {1, 1500, true}, {300, 10, false}});
  if (!kEmulated) cases.push_back({4097, 10, false});

  uint64_t seed = 6000;
  for (const Case& c : cases) {
    const std::vector<float> logits = make_logits(c.rows, c.classes, seed += 10);
    const std::vector<int32_t> labels = make_xent_labels(c.rows, c.classes, seed + 1);
    for (DlogitsMode mode : {DlogitsMode::kSeparate, DlogitsMode::kNone, DlogitsMode::kAliased}) {
      if (!c.every_dlogits_mode && mode != DlogitsMode::kSeparate) continue;
      const float grad_scale =
          mode == DlogitsMode::kAliased ? 0.37f : 1.0f / static_cast<float>(c.rows);
      INFO("rows " << c.rows << ", classes " << c.classes << ", grad_scale " << grad_scale
                   << ", dlogits "
                   << (mode == DlogitsMode::kSeparate ? "separate"
                       : mode == DlogitsMode::kNone   ? "null"
                                                      : "aliasing logits"));
      const XentReference ref = ref_xent(logits, labels, c.classes, grad_scale);
      const XentOutput got = cuda_xent(*be, logits, labels, c.classes, grad_scale, mode);
      const XentOutput want = cpu_xent(*cpu, logits, labels, c.classes, grad_scale, mode);
      CHECK(got.result.correct == ref.correct);
      CHECK(want.result.correct == ref.correct);
      INFO("loss_sum: cuda " << got.result.loss_sum << ", cpu " << want.result.loss_sum
                             << ", reference " << ref.loss_sum << ", cond " << ref.loss_cond);
      CHECK(std::isfinite(got.result.loss_sum));
      CHECK(std::fabs(got.result.loss_sum - ref.loss_sum) <= kTol * ref.loss_cond);
      CHECK(std::fabs(want.result.loss_sum - ref.loss_sum) <= kTol * ref.loss_cond);
      CHECK(std::fabs(got.result.loss_sum - want.result.loss_sum) <= kTol * ref.loss_cond);
      // Relative to the loss itself too (the rows term is for one class, where the loss is 0).
      CHECK(std::fabs(got.result.loss_sum - ref.loss_sum) <=
            kTol * std::fabs(ref.loss_sum) + 1e-6 * c.rows);
      if (mode != DlogitsMode::kNone) {
        require_all_agree(got.dlogits, want.dlogits, ref.dlogits, "dlogits");
      }
    }
  }
}

TEST_CASE("cuda softmax_xent reports the first label outside [0, classes)", DDP_CUDA_TAGS) {
  auto be = make_cuda();
  auto cpu = ddp::make_cpu_backend();
  const int64_t rows = 9, classes = 10;
  const std::vector<float> logits = make_logits(rows, classes, 7000);
  DeviceTensor l(logits, rows, classes);
  ddp::DeviceArray<int32_t> device_labels(rows);
  auto expect = [&](std::vector<int32_t> labels, const std::string& message) {
    device_labels.upload(labels.data(), labels.size());
    require_error([&] { be->softmax_xent(l.view(), device_labels.data(), 1.0f, nullptr); },
                  message);
    require_error(
        [&] { cpu->softmax_xent(host_view(logits, rows, classes), labels.data(), 1.0f, nullptr); },
        message);
  };
  std::vector<int32_t> labels = random_labels(rows, classes, 7001);
  labels[2] = 10;
  labels[5] = -1;
  expect(labels, "softmax_xent: row 2 has label 10, outside [0, 10)");
  labels[0] = -3;
  expect(labels, "softmax_xent: row 0 has label -3, outside [0, 10)");

  // The backend stays usable after the error.
  labels = random_labels(rows, classes, 7002);
  device_labels.upload(labels.data(), labels.size());
  const ddp::XentResult got = be->softmax_xent(l.view(), device_labels.data(), 1.0f, nullptr);
  const XentReference ref = ref_xent(logits, labels, classes, 1.0);
  CHECK(got.correct == ref.correct);
  CHECK(std::fabs(got.loss_sum - ref.loss_sum) <= kTol * ref.loss_cond);
}

TEST_CASE("cuda softmax_xent_deferred adds batches into slots read later", DDP_CUDA_TAGS) {
  auto be = make_cuda();
  auto cpu = ddp::make_cpu_backend();
  const int64_t classes = 10;
  // Three batches into slot 0 (the micro-batches of one step), one into slot 1.
  const int64_t rows[4] = {9, 5, 9, 7};
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> labels;
  double loss0 = 0.0;
  int64_t correct0 = 0;
  for (int b = 0; b < 4; ++b) {
    logits.push_back(make_logits(rows[b], classes, 7100 + b));
    labels.push_back(random_labels(rows[b], classes, 7200 + b));
    if (b == 3) continue;
    const XentReference ref = ref_xent(logits[b], labels[b], classes, 1.0);
    loss0 += ref.loss_sum;
    correct0 += ref.correct;
  }
  std::vector<DeviceTensor> l, d;
  std::vector<ddp::DeviceArray<int32_t>> device_labels;
  for (int b = 0; b < 4; ++b) {
    l.emplace_back(logits[b], rows[b], classes);
    d.emplace_back(rows[b], classes);
    device_labels.emplace_back(static_cast<size_t>(rows[b]));
    device_labels.back().upload(labels[b].data(), labels[b].size());
  }
  for (int b = 0; b < 4; ++b) {
    be->softmax_xent_deferred(l[b].view(), device_labels[b].data(), 0.5f, &d[b].view(),
                              b == 3 ? 1 : 0);
    cpu->softmax_xent_deferred(host_view(logits[b], rows[b], classes), labels[b].data(), 0.5f,
                               nullptr, b == 3 ? 1 : 0);
  }
  const ddp::XentResult slot1 = be->take_xent_totals(1);
  const XentReference ref3 = ref_xent(logits[3], labels[3], classes, 1.0);
  CHECK(slot1.correct == ref3.correct);
  CHECK(std::fabs(slot1.loss_sum - ref3.loss_sum) <= kTol * ref3.loss_cond);
  const ddp::XentResult slot0 = be->take_xent_totals(0);
  CHECK(slot0.correct == correct0);
  CHECK(std::fabs(slot0.loss_sum - loss0) <= 3 * kTol * std::fabs(loss0));
  // The CPU backend's deferred form agrees, and both slots are empty once taken.
  const ddp::XentResult cpu0 = cpu->take_xent_totals(0);
  CHECK(cpu0.correct == slot0.correct);
  CHECK(cpu0.loss_sum == Approx(slot0.loss_sum).epsilon(1e-6));
  CHECK(cpu->take_xent_totals(1).correct == slot1.correct);
  CHECK(be->take_xent_totals(0).loss_sum == 0.0);
  CHECK(cpu->take_xent_totals(0).correct == 0);
  // The gradient is the immediate form's.
  DeviceTensor d_now(rows[0], classes);
  be->softmax_xent(l[0].view(), device_labels[0].data(), 0.5f, &d_now.view());
  CHECK(d_now.download() == d[0].download());
  // A slot starts over after a take: the next batch is not added to the old totals.
  be->softmax_xent_deferred(l[3].view(), device_labels[3].data(), 1.0f, nullptr, 0);
  CHECK(be->take_xent_totals(0).correct == ref3.correct);

  // A bad label is reported when its slot is taken (the host did not wait at the launch).
  std::vector<int32_t> bad = labels[1];
  bad[3] = 12;
  device_labels[1].upload(bad.data(), bad.size());
  be->softmax_xent_deferred(l[0].view(), device_labels[0].data(), 1.0f, nullptr, 1);
  be->softmax_xent_deferred(l[1].view(), device_labels[1].data(), 1.0f, nullptr, 1);
  require_error([&] { be->take_xent_totals(1); },
                "softmax_xent: row 3 has label 12, outside the model's classes");
  CHECK(be->take_xent_totals(1).correct == 0);  // taken, even though it failed
  require_error([&] { be->take_xent_totals(2); }, "take_xent_totals: slot 2 (0 or 1)");
  require_error([&] { cpu->take_xent_totals(-1); }, "take_xent_totals: slot -1 (0 or 1)");
}

// ---- SGD ---------------------------------------------------------------------------------

TEST_CASE("cuda sgd_step is bitwise the CPU backend's step", DDP_CUDA_TAGS) {
  auto be = make_cuda();
  auto cpu = ddp::make_cpu_backend();
  struct Case {
    const char* name;
    ddp::SgdOptions opt;
  };
  auto options = [](float lr, float momentum, float dampening, float wd, bool nesterov) {
    ddp::SgdOptions o;
    o.lr = lr;
    o.momentum = momentum;
    o.dampening = dampening;
    o.weight_decay = wd;
    o.nesterov = nesterov;
    return o;
  };
  const std::vector<Case> cases = {
      {"plain", options(0.0123f, 0.0f, 0.0f, 0.0f, false)},
      {"weight decay", options(0.0123f, 0.0f, 0.0f, 0.01f, false)},
      {"momentum", options(0.05f, 0.9f, 0.0f, 0.0f, false)},
      {"momentum, dampening", options(0.05f, 0.9f, 0.3f, 0.0f, false)},
      {"nesterov, weight decay", options(0.05f, 0.9f, 0.0f, 1e-3f, true)},
      {"everything but nesterov", options(0.2f, 0.5f, 0.1f, 0.05f, false)},
  };
  const int64_t big = kEmulated ? 1027 : (1 << 20) + 3;
  uint64_t seed = 8000;
  for (const Case& c : cases) {
    for (int64_t n : {big, int64_t{3}, int64_t{4}, int64_t{9}}) {
      // front 1: every pointer off 16-byte alignment, the scalar path.
      for (int64_t front : {kGuard, int64_t{1}}) {
        for (bool starts_first : {true, false}) {
          INFO(c.name << ", n " << n << ", front " << front
                      << (starts_first ? ", from first_step" : ", momentum_buf preset"));
          std::vector<float> p = random_floats(static_cast<size_t>(n), seed += 10);
          std::vector<float> buf = random_floats(static_cast<size_t>(n), seed + 1);
          const std::vector<float> buf0 = buf;
          DeviceTensor dp(p, 1, n, front), dbuf(buf, 1, n, front);
          for (int step = 0; step < 3; ++step) {
            INFO("step " << step);
            std::vector<float> g = random_floats(static_cast<size_t>(n), seed + 2 + step);
            DeviceTensor dg(g, 1, n, front);
            const bool first = starts_first && step == 0;
            be->sgd_step(dp.view(), dg.view(), dbuf.view(), c.opt, first);
            Tensor pv = host_view(p, 1, n), bv = host_view(buf, 1, n);
            cpu->sgd_step(pv, host_view(g, 1, n), bv, c.opt, first);
            require_bitwise_equal(dp.download(), p, "params");
            require_bitwise_equal(dbuf.download(), buf, "momentum_buf");
            require_bitwise_equal(dg.download(), g, "grads are an input only");
            if (c.opt.momentum == 0.0f) require_bitwise_equal(buf, buf0, "untouched momentum_buf");
            require_guards_intact(dp, "params");
            require_guards_intact(dbuf, "momentum_buf");
          }
        }
      }
    }
  }
}

// ---- elementwise -------------------------------------------------------------------------

// Sizes around the vector width and ragged ones; fronts that keep or break 16-byte alignment.
std::vector<std::pair<int64_t, int64_t>> elementwise_shapes() {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {1, 3},  {1, 4},  {1, 5},
                                                     {3, 5}, {8, 16}, {17, 33}};
  if (!kEmulated) shapes.insert(shapes.end(), {{1000, 1027}, {256, 4096}});
  return shapes;
}

float quiet_nan_with_payload(uint32_t payload) {
  const uint32_t bits = 0x7fc00000u | payload;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Random values with exact zeros of both signs and a NaN whose payload the poison lacks.
std::vector<float> special_values(int64_t n, uint64_t seed) {
  std::vector<float> v = random_floats(static_cast<size_t>(n), seed);
  if (n > 1) v[1] = 0.0f;
  if (n > 2) v[2] = -0.0f;
  if (n > 3) v[n - 1] = quiet_nan_with_payload(0x123);
  return v;
}

TEST_CASE("cuda relu_forward and relu_backward are the CPU backend's, in place too",
          DDP_CUDA_TAGS) {
  auto be = make_cuda();
  auto cpu = ddp::make_cpu_backend();
  uint64_t seed = 9000;
  for (const auto& [rows, cols] : elementwise_shapes()) {
    for (int64_t front : {kGuard, int64_t{1}}) {
      INFO("shape " << rows << " x " << cols << ", front " << front);
      const int64_t n = rows * cols;
      const std::vector<float> x = special_values(n, seed += 10);
      std::vector<float> y_cpu(x.size(), kNaN);
      Tensor ycv = host_view(y_cpu, rows, cols);
      cpu->relu_forward(host_view(x, rows, cols), ycv);
      for (size_t i = 0; i < x.size(); ++i) {
        if (!std::isnan(x[i])) REQUIRE(y_cpu[i] == std::max(x[i], 0.0f));
      }

      DeviceTensor dx_in(x, rows, cols, front), dy_out(rows, cols, front);
      be->fill(dy_out.view(), kNaN);
      be->relu_forward(dx_in.view(), dy_out.view());
      require_bitwise_equal(dy_out.download(), y_cpu, "relu_forward");
      require_guards_intact(dy_out, "relu_forward y");
      be->relu_forward(dx_in.view(), dx_in.view());
      require_bitwise_equal(dx_in.download(), y_cpu, "relu_forward in place");
      require_guards_intact(dx_in, "relu_forward in place");

      // Backward through the forward's output (zeros, positives, a NaN), with NaN gradients
      // behind a dead unit (the last) and a live one (the first, when there is room).
      std::vector<float> y = y_cpu;
      std::vector<float> g = special_values(n, seed + 1);
      if (n > 4) {
        y[0] = 0.75f;
        g[0] = quiet_nan_with_payload(0x456);
      }
      std::vector<float> dx_cpu(g.size(), kNaN);
      Tensor dxcv = host_view(dx_cpu, rows, cols);
      cpu->relu_backward(host_view(g, rows, cols), host_view(y, rows, cols), dxcv);
      DeviceTensor dg(g, rows, cols, front), dy(y, rows, cols, front), ddx(rows, cols, front);
      be->fill(ddx.view(), kNaN);
      be->relu_backward(dg.view(), dy.view(), ddx.view());
      require_bitwise_equal(ddx.download(), dx_cpu, "relu_backward");
      require_guards_intact(ddx, "relu_backward dx");
      be->relu_backward(dg.view(), dy.view(), dg.view());
      require_bitwise_equal(dg.download(), dx_cpu, "relu_backward in place");
      require_guards_intact(dg, "relu_backward in place");
      for (size_t i = 0; i < g.size(); ++i) {
        if (!(y[i] > 0.0f)) REQUIRE(dx_cpu[i] == 0.0f);  // a select, even for a NaN gradient
      }
    }
  }
}

TEST_CASE("cuda fill, scale and copy write exactly their views", DDP_CUDA_TAGS) {
  auto be = make_cuda();
  auto cpu = ddp::make_cpu_backend();
  uint64_t seed = 10000;
  for (const auto& [rows, cols] : elementwise_shapes()) {
    for (int64_t front : {kGuard, int64_t{1}}) {
      INFO("shape " << rows << " x " << cols << ", front " << front);
      const int64_t n = rows * cols;
      DeviceTensor t(rows, cols, front);
      be->fill(t.view(), 1.5f);
      require_bitwise_equal(t.download(), std::vector<float>(static_cast<size_t>(n), 1.5f), "fill");
      require_guards_intact(t, "fill");

      const std::vector<float> v = random_floats(static_cast<size_t>(n), seed += 10);
      std::vector<float> scaled = v;
      Tensor sv = host_view(scaled, rows, cols);
      cpu->scale(sv, 0.37f);
      for (size_t i = 0; i < v.size(); ++i) REQUIRE(scaled[i] == v[i] * 0.37f);
      t.upload(v);
      be->scale(t.view(), 0.37f);
      require_bitwise_equal(t.download(), scaled, "scale");
      require_guards_intact(t, "scale");

      // Source and destination alignments differ when front is 1 (kGuard + 1 is unaligned too).
      for (int64_t dst_front : {kGuard, front + 1}) {
        DeviceTensor dst(rows, cols, dst_front);
        be->fill(dst.view(), kNaN);
        be->copy(t.view(), dst.view());
        require_bitwise_equal(dst.download(), scaled, "copy");
        require_guards_intact(dst, "copy");
      }
      be->copy(t.view(), t.view());  // same view: nothing to do
      require_bitwise_equal(t.download(), scaled, "copy onto itself");
    }
  }
}

TEST_CASE("cuda count_nonfinite counts NaN and infinities of its view only", DDP_CUDA_TAGS) {
  auto be = make_cuda();
  auto cpu = ddp::make_cpu_backend();
  uint64_t seed = 11000;
  for (const auto& [rows, cols] : elementwise_shapes()) {
    const int64_t n = rows * cols;
    INFO("shape " << rows << " x " << cols);
    DeviceTensor t(rows, cols, kGuard);  // guard zones around the view hold NaN
    std::vector<float> v = random_floats(static_cast<size_t>(n), seed += 10);
    t.upload(v);
    CHECK(be->count_nonfinite(t.view()) == 0);
    // Non-finite values at the ends and in the middle; the largest finite float is not one.
    const float specials[] = {kNaN, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
    const std::set<int64_t> at = {0, n / 2, n - 1};  // fewer than 3 for tiny shapes
    int64_t expected = 0;
    for (int64_t i : at) v[static_cast<size_t>(i)] = specials[expected++];
    if (n > 3) v[1] = std::numeric_limits<float>::max();
    t.upload(v);
    CHECK(be->count_nonfinite(t.view()) == expected);
    CHECK(cpu->count_nonfinite(host_view(v, rows, cols)) == expected);
    require_guards_intact(t, "count_nonfinite");
  }
}

// ---- argument errors ---------------------------------------------------------------------

TEST_CASE("cuda kernels refuse wrong arguments with the CPU backend's messages", DDP_CUDA_TAGS) {
  auto be = make_cuda();
  DeviceTensor x(2, 3), x2(2, 3), w(4, 3), bias(1, 4), y(2, 4), w_bad(4, 4);
  std::vector<float> host(6, 1.0f);

  SECTION("a CPU tensor") {
    Tensor host_x = host_view(host, 2, 3);
    require_error([&] { be->linear_forward(host_x, w.view(), bias.view(), false, y.view()); },
                  "linear_forward: x is a cpu tensor, the cuda backend needs cuda tensors");
    require_error([&] { be->fill(host_x, 0.0f); },
                  "fill: t is a cpu tensor, the cuda backend needs cuda tensors");
    require_error([&] { be->relu_forward(x.view(), host_x); },
                  "is a cpu tensor, the cuda backend needs cuda tensors");
    ddp::SgdOptions opt;
    require_error([&] { be->sgd_step(x.view(), host_x, x.view(), opt, true); },
                  "sgd_step: grads is a cpu tensor, the cuda backend needs cuda tensors");
  }
  SECTION("shape mismatches") {
    require_error([&] { be->linear_forward(x.view(), w_bad.view(), bias.view(), false, y.view()); },
                  "linear_forward: shapes do not match");
    require_error([&] { be->linear_backward_input(y.view(), w_bad.view(), nullptr, x.view()); },
                  "linear_backward_input: shapes do not match");
    require_error(
        [&] { be->linear_backward_params(y.view(), x.view(), false, w_bad.view(), bias.view()); },
        "linear_backward_params: shapes do not match");
    require_error([&] { be->relu_forward(x.view(), y.view()); }, "relu_forward: shapes differ");
    ddp::SgdOptions opt;
    require_error([&] { be->sgd_step(x.view(), y.view(), x.view(), opt, true); },
                  "sgd_step: sizes differ");
  }
  SECTION("option combinations torch refuses, and overlapping copies") {
    ddp::SgdOptions opt;
    opt.momentum = 0.9f;
    opt.dampening = 0.1f;
    opt.nesterov = true;
    Tensor buf = w.view().first_rows(2);
    require_error([&] { be->sgd_step(x.view(), x2.view(), buf, opt, true); },
                  "nesterov needs momentum > 0 and dampening == 0");
    Tensor shifted{y.view().data + 1, 1, 4, ddp::Device::CUDA};
    Tensor front_row = y.view().first_rows(1);
    require_error([&] { be->copy(front_row, shifted); }, "copy: output dst overlaps input src");
  }
  SECTION("force_gemm_plan needs a CUDA backend and a valid plan") {
    auto cpu = ddp::make_cpu_backend();
    GemmPlan plan;
    require_error([&] { ddp::force_gemm_plan(*cpu, &plan); },
                  "force_gemm_plan: backend 'cpu' is not the CUDA backend");
    plan.tile = 3;
    require_error([&] { ddp::force_gemm_plan(*be, &plan); }, "tile 0..2, splits >= 1");
    plan.tile = 0;
    plan.splits = 0;
    require_error([&] { ddp::force_gemm_plan(*be, &plan); }, "tile 0..2, splits >= 1");
  }
  SECTION("BatchUploader misuse") {
    auto cpu = ddp::make_cpu_backend();
    require_error([&] { ddp::BatchUploader up(*cpu, 8, 3); },
                  "BatchUploader: backend 'cpu' is not the CUDA backend");
    ddp::BatchUploader up(*be, 8, 3);
    const std::vector<float> xs(9 * 3, 0.25f);
    const std::vector<int32_t> labels(9, 1);
    require_error([&] { up.acquire(); }, "BatchUploader::acquire: no batch was uploaded");
    require_error([&] { up.upload(xs.data(), labels.data(), 9); },
                  "BatchUploader::upload: 9 rows, expected 1..8");
    require_error([&] { up.upload(xs.data(), labels.data(), 0); },
                  "BatchUploader::upload: 0 rows, expected 1..8");
    up.upload(xs.data(), labels.data(), 8);
    up.upload(xs.data(), labels.data(), 8);
    require_error([&] { up.upload(xs.data(), labels.data(), 8); },
                  "BatchUploader::upload: both slots are taken");
    // One acquired (in use) and one waiting: still no room.
    up.acquire();
    require_error([&] { up.upload(xs.data(), labels.data(), 8); },
                  "BatchUploader::upload: both slots are taken");
    up.acquire();
    up.upload(xs.data(), labels.data(), 8);  // the first batch's slot is free again
    up.acquire();
    require_error([&] { up.acquire(); }, "BatchUploader::acquire: no batch was uploaded");
  }
#if !defined(DDP_CUDA_EMULATION)
  SECTION("labels in host memory") {
    const std::vector<int32_t> labels(2, 0);
    require_error([&] { be->softmax_xent(y.view(), labels.data(), 1.0f, nullptr); },
                  "softmax_xent: labels must be in device memory");
  }
#endif
}

}  // namespace
