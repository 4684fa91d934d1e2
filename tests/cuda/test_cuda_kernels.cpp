// The CUDA kernels: the kernel conformance suite (tests/support/kernel_conformance.h: every
// kernel against double-precision references, bitwise where the result is exact, NaN-poisoned
// outputs in guarded, aligned and misaligned views), every GEMM plan, plan choice, determinism,
// the deferred loss totals and argument errors. The sweeps over shapes and plans are tagged
// [conformance]: one stream, read back through synchronous copies, so the emulation's
// deferred streams (ctest cuda_emu_deferred) leave them out. The optimizer steps are tagged
// [elementwise] too: one thread per element and no barrier, so the serial thread schedules
// (ctest cuda_emu_serial) have nothing to find in them.
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
#include "kernel_conformance.h"

namespace {

using ddp::Backend;
using ddp::GemmPlan;
using ddp::Tensor;
using ddp_cuda_test::DeviceTensor;
using ddp_cuda_test::ForcedGemmPlan;
using ddp_cuda_test::host_view;
using ddp_cuda_test::kEmulated;
using ddp_cuda_test::kNaN;
using ddp_cuda_test::kTol;
using ddp_cuda_test::random_labels;
using ddp_cuda_test::require_accurate;
using ddp_cuda_test::require_bitwise_equal;
using ddp_cuda_test::require_error;
using ddp_kernel_test::describe;
using ddp_kernel_test::LinearData;
using ddp_kernel_test::LinearShape;
using ddp_kernel_test::make_linear_data;
using ddp_kernel_test::make_logits;
using ddp_kernel_test::Reference;
using ddp_kernel_test::ref_backward_input;
using ddp_kernel_test::ref_backward_params;
using ddp_kernel_test::ref_forward;
using ddp_kernel_test::ref_xent;
using ddp_kernel_test::XentReference;
namespace kt = ddp_kernel_test;

std::unique_ptr<Backend> make_cuda() { return ddp::make_cuda_backend(0); }

/// Runs conform(target, misaligned) on the CUDA backend, in aligned and in misaligned views.
template <typename Conform>
void on_cuda(Conform conform) {
  auto be = make_cuda();
  kt::KernelTarget target(*be);
  for (bool misaligned : {false, true}) {
    INFO((misaligned ? "misaligned views" : "aligned views"));
    target.set_misaligned(misaligned);
    conform(target, misaligned);
  }
}

/// In the emulation, misaligned views (where a kernel must take its scalar path) run on the
/// first few cases only: the emulated run is about indexing and barriers, not about coverage
/// of sizes, and its time is every build's.
template <typename T>
std::vector<T> cases_for(std::vector<T> all, bool misaligned) {
  if (kEmulated && misaligned && all.size() > 4) all.resize(4);
  return all;
}

// ---- conformance ---------------------------------------------------------------------------

// The conformance shapes (ragged, batch 1, multiples of 4 in every extent, random), and on a
// real device the model's own shapes and large ones.
std::vector<LinearShape> linear_shapes() {
  std::vector<LinearShape> shapes = kt::conformance_linear_shapes(3, kEmulated ? 80 : 700);
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

TEST_CASE("cuda backend conforms: linear_forward, with and without fused relu",
          DDP_CUDA_TAGS "[conformance]") {
  on_cuda([](kt::KernelTarget& t, bool misaligned) {
    kt::conform_linear_forward(t, cases_for(linear_shapes(), misaligned), 1000);
  });
}

TEST_CASE("cuda backend conforms: linear_backward_input, with the relu mask",
          DDP_CUDA_TAGS "[conformance]") {
  on_cuda([](kt::KernelTarget& t, bool misaligned) {
    kt::conform_linear_backward_input(t, cases_for(linear_shapes(), misaligned), 2000);
  });
}

TEST_CASE("cuda backend conforms: linear_backward_params overwrites or accumulates",
          DDP_CUDA_TAGS "[conformance]") {
  on_cuda([](kt::KernelTarget& t, bool misaligned) {
    kt::conform_linear_backward_params(t, cases_for(linear_shapes(), misaligned), 3000);
  });
}

TEST_CASE("cuda backend conforms: softmax_xent", DDP_CUDA_TAGS "[conformance]") {
  // Every register-cached width (1 to 32 values per lane) and the generic path (> 1024).
  std::vector<kt::XentCase> cases;
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
  on_cuda([&](kt::KernelTarget& t, bool misaligned) {
    kt::conform_softmax_xent(t, cases_for(cases, misaligned), 6000);
    kt::conform_softmax_xent_extremes(t);
  });
}

TEST_CASE("cuda backend conforms: sgd_step is torch.optim.SGD for every option combination",
          DDP_CUDA_TAGS "[conformance][elementwise]") {
  const int64_t big = kEmulated ? 1027 : (1 << 20) + 3;
  on_cuda([&](kt::KernelTarget& t, bool) {
    for (int64_t n : {big, int64_t{3}, int64_t{4}, int64_t{9}}) kt::conform_sgd_step(t, n, 8000);
  });
}

TEST_CASE("cuda backend conforms: adam_step is torch.optim.Adam and AdamW for every option",
          DDP_CUDA_TAGS "[conformance][elementwise]") {
  const int64_t big = kEmulated ? 1027 : (1 << 20) + 3;
  on_cuda([&](kt::KernelTarget& t, bool) {
    for (int64_t n : {big, int64_t{3}, int64_t{4}, int64_t{9}}) kt::conform_adam_step(t, n, 9000);
  });
}

TEST_CASE("cuda backend conforms: relu, fill, scale, copy, count_nonfinite",
          DDP_CUDA_TAGS "[conformance]") {
  on_cuda([](kt::KernelTarget& t, bool) {
    uint64_t seed = 9000;
    for (const auto& [rows, cols] : kt::conformance_elementwise_shapes(!kEmulated)) {
      kt::conform_relu(t, rows, cols, seed += 10);
      kt::conform_fill_scale_copy(t, rows, cols, seed += 10);
      kt::conform_count_nonfinite(t, rows, cols, seed += 10);
    }
  });
}

// The three products on the CUDA backend, through a target that checks the guards.
std::vector<float> cuda_forward(Backend& be, const LinearData& d, bool relu) {
  kt::KernelTarget t(be);
  std::vector<float> y = kt::run_forward(t, d, relu);
  t.require_guards_intact("linear_forward");
  return y;
}

std::vector<float> cuda_backward_input(Backend& be, const LinearData& d, bool mask) {
  kt::KernelTarget t(be);
  std::vector<float> dx = kt::run_backward_input(t, d, mask);
  t.require_guards_intact("linear_backward_input");
  return dx;
}

std::pair<std::vector<float>, std::vector<float>> cuda_backward_params(Backend& be,
                                                                       const LinearData& d,
                                                                       bool accumulate) {
  kt::KernelTarget t(be);
  auto dw_db = kt::run_backward_params(t, d, accumulate);
  t.require_guards_intact("linear_backward_params");
  return dw_db;
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

TEST_CASE("cuda every GEMM plan computes all three products of a Linear layer",
          DDP_CUDA_TAGS "[conformance]") {
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

// ---- softmax cross-entropy: errors and deferred totals ------------------------------------

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
