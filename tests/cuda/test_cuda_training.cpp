// Three full training steps of a Sequential MLP on the CUDA and the CPU backend from the same
// weights must agree, with no device allocation in the steady state; and the BatchUploader's
// documented loop must hand back every batch exactly.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "nn/sequential.h"

namespace {

using ddp::Backend;
using ddp::Buffer;
using ddp::Device;
using ddp::Tensor;
using ddp_cuda_test::host_view;
using ddp_cuda_test::kEmulated;
using ddp_cuda_test::random_floats;
using ddp_cuda_test::random_labels;
using ddp_cuda_test::require_bitwise_equal;

constexpr double kTrainTol = 1e-4;
constexpr double kLossTol = 1e-5;

/// A Sequential bound to flat parameter, gradient and momentum arenas on one device (the way
/// the trainer lays them out: parameters back to back in registration order).
struct Model {
  Model(const std::vector<int64_t>& widths, int64_t max_batch, Device device)
      : net(widths, "relu", max_batch, device) {
    for (size_t n : net.parameter_numels()) {
      offsets.push_back(total);
      total += n;
    }
    values = Buffer(total, device);
    grads = Buffer(total, device);
    momentum = Buffer(total, device);
    net.bind(values.data(), grads.data(), offsets);
  }
  Tensor flat(Buffer& b) { return Tensor::of(b, 1, static_cast<int64_t>(total)); }

  ddp::Sequential net;
  std::vector<size_t> offsets;
  size_t total = 0;
  Buffer values, grads, momentum;
};

std::vector<float> to_host(Buffer& b) {
  std::vector<float> out(b.numel());
  Tensor dst = host_view(out, 1, static_cast<int64_t>(out.size()));
  ddp::copy_tensor(Tensor::of(b, 1, static_cast<int64_t>(b.numel())), dst);
  return out;
}

/// Finite, norm-wise ||got - want|| <= tol·||want||, and element-wise
/// |got_i - want_i| <= tol·(|want_i| + rms(want)): relative, without demanding it of values that
/// happen to lie near zero.
void require_close_relative(const std::vector<float>& got, const std::vector<float>& want,
                            double tol, const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  REQUIRE(!want.empty());
  double diff2 = 0.0, want2 = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff2 += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    want2 += double(want[i]) * want[i];
  }
  const double rms = std::sqrt(want2 / static_cast<double>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!std::isfinite(got[i]) || !std::isfinite(want[i]) ||
        !(err <= tol * (std::fabs(want[i]) + rms))) {
      FAIL("element " << i << ": got " << got[i] << ", want " << want[i] << " (rms " << rms << ")");
    }
  }
  INFO("||got - want|| = " << std::sqrt(diff2) << ", ||want|| = " << std::sqrt(want2));
  REQUIRE(std::sqrt(diff2) <= tol * std::sqrt(want2));
}

/// Per parameter, so a failure names it.
void require_arenas_close(Model& cuda, Model& cpu, Buffer Model::*arena, const char* what) {
  const std::vector<float> got = to_host(cuda.*arena);
  const std::vector<float> want = to_host(cpu.*arena);
  const std::vector<std::string> names = cpu.net.parameter_names();
  const std::vector<size_t> numels = cpu.net.parameter_numels();
  for (size_t i = 0; i < names.size(); ++i) {
    const auto first = static_cast<std::ptrdiff_t>(cpu.offsets[i]);
    const auto last = first + static_cast<std::ptrdiff_t>(numels[i]);
    require_close_relative(std::vector<float>(got.begin() + first, got.begin() + last),
                           std::vector<float>(want.begin() + first, want.begin() + last), kTrainTol,
                           std::string(what) + " of " + names[i]);
  }
}

struct StepResult {
  ddp::XentResult xent;
  std::vector<size_t> ready;
};

StepResult train_step(Backend& be, Model& m, const Tensor& x, const int32_t* labels,
                      Buffer& dlogits, const ddp::SgdOptions& opt, bool first_step) {
  StepResult r;
  const Tensor& logits = m.net.forward(be, x);
  Tensor d = Tensor::of(dlogits, x.rows, m.net.out_features());
  r.xent = be.softmax_xent(logits, labels, 1.0f / static_cast<float>(x.rows), &d);
  m.net.backward(be, d, false, [&](size_t i) { r.ready.push_back(i); });
  Tensor p = m.flat(m.values), g = m.flat(m.grads), buf = m.flat(m.momentum);
  be.sgd_step(p, g, buf, opt, first_step);
  return r;
}

struct TrainCase {
  std::vector<int64_t> widths;
  int64_t rows;
  bool uploader;  // batches through BatchUploader, else copy_tensor + DeviceArray labels
};

std::string describe(const TrainCase& c) {
  std::ostringstream oss;
  oss << "widths {";
  for (size_t i = 0; i < c.widths.size(); ++i) oss << (i ? ", " : "") << c.widths[i];
  oss << "}, batch " << c.rows << ", " << (c.uploader ? "BatchUploader" : "DeviceArray labels");
  return oss.str();
}

TEST_CASE("cuda training steps match the CPU backend and allocate nothing", DDP_CUDA_TAGS) {
  std::vector<TrainCase> cases = {{{37, 64, 19, 7}, 29, false}, {{37, 64, 19, 7}, 29, true}};
  if (!kEmulated) {
    cases.push_back({{784, 256, 256, 10}, 256, false});
    cases.push_back({{784, 256, 256, 10}, 256, true});
  }
  ddp::SgdOptions opt;
  opt.lr = 0.05f;
  opt.momentum = 0.9f;
  opt.weight_decay = 1e-4f;
  constexpr int kSteps = 3;

  for (const TrainCase& c : cases) {
    INFO(describe(c));
    const int64_t in = c.widths.front(), out = c.widths.back();
    auto cuda = ddp::make_cuda_backend(0);
    auto cpu = ddp::make_cpu_backend();
    Model cpu_model(c.widths, c.rows, Device::CPU);
    Model cuda_model(c.widths, c.rows, Device::CUDA);
    ddp::Rng rng(42);
    cpu_model.net.init_uniform(rng);
    Tensor cuda_values = cuda_model.flat(cuda_model.values);
    ddp::copy_tensor(cpu_model.flat(cpu_model.values), cuda_values);

    std::vector<std::vector<float>> xs;
    std::vector<std::vector<int32_t>> labels;
    for (int s = 0; s < kSteps; ++s) {
      xs.push_back(random_floats(static_cast<size_t>(c.rows * in), 100 + s));
      labels.push_back(random_labels(c.rows, out, 200 + s));
    }
    Buffer cpu_dlogits(static_cast<size_t>(c.rows * out), Device::CPU);
    Buffer cuda_dlogits(static_cast<size_t>(c.rows * out), Device::CUDA);
    Buffer cuda_x(static_cast<size_t>(c.rows * in), Device::CUDA);
    ddp::DeviceArray<int32_t> cuda_labels(static_cast<size_t>(c.rows));
    std::unique_ptr<ddp::BatchUploader> uploader;
    if (c.uploader) {
      uploader = std::make_unique<ddp::BatchUploader>(*cuda, c.rows, in);
      uploader->upload(xs[0].data(), labels[0].data(), c.rows);
    }

    // Parameters backward announces, last layer first, bias before weight.
    std::vector<size_t> expected_ready;
    for (size_t i = cpu_model.net.parameters().size(); i > 0; i -= 2) {
      expected_ready.push_back(i - 1);
      expected_ready.push_back(i - 2);
    }

    int64_t allocations_after_first_step = 0;
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s + 1);
      Tensor x_device;
      const int32_t* labels_device = nullptr;
      if (c.uploader) {
        const ddp::BatchUploader::DeviceBatch b = uploader->acquire();
        if (s + 1 < kSteps) uploader->upload(xs[s + 1].data(), labels[s + 1].data(), c.rows);
        x_device = b.x;
        labels_device = b.labels;
      } else {
        x_device = Tensor::of(cuda_x, c.rows, in);
        ddp::copy_tensor(host_view(xs[s], c.rows, in), x_device);
        cuda_labels.upload(labels[s].data(), labels[s].size());
        labels_device = cuda_labels.data();
      }
      const StepResult got =
          train_step(*cuda, cuda_model, x_device, labels_device, cuda_dlogits, opt, s == 0);
      const StepResult want = train_step(*cpu, cpu_model, host_view(xs[s], c.rows, in),
                                         labels[s].data(), cpu_dlogits, opt, s == 0);

      INFO("loss_sum: cuda " << got.xent.loss_sum << ", cpu " << want.xent.loss_sum);
      REQUIRE(std::isfinite(got.xent.loss_sum));
      REQUIRE(std::fabs(got.xent.loss_sum - want.xent.loss_sum) <=
              kLossTol * std::fabs(want.xent.loss_sum));
      CHECK(got.xent.correct == want.xent.correct);
      CHECK(got.ready == want.ready);
      CHECK(want.ready == expected_ready);
      require_arenas_close(cuda_model, cpu_model, &Model::grads, "gradient");
      require_arenas_close(cuda_model, cpu_model, &Model::momentum, "momentum buffer");
      require_arenas_close(cuda_model, cpu_model, &Model::values, "weights");

      if (s == 0) allocations_after_first_step = ddp::cuda_allocation_count();
    }
    INFO("device/pinned allocations during steps 2 and 3");
    CHECK(ddp::cuda_allocation_count() == allocations_after_first_step);
  }
}

TEST_CASE("cuda BatchUploader hands back every batch exactly, in order", DDP_CUDA_TAGS) {
  auto be = ddp::make_cuda_backend(0);
  const int64_t max_rows = kEmulated ? 9 : 512, features = kEmulated ? 13 : 784, classes = 10;
  const std::vector<int64_t> rows = {max_rows, 4, max_rows, 1, 7};
  const size_t batches = rows.size();
  std::vector<std::vector<float>> xs;
  std::vector<std::vector<int32_t>> labels;
  for (size_t i = 0; i < batches; ++i) {
    xs.push_back(random_floats(static_cast<size_t>(rows[i] * features), 300 + i));
    labels.push_back(random_labels(rows[i], classes, 400 + i));
  }
  ddp::BatchUploader up(*be, max_rows, features);
  Buffer copied(static_cast<size_t>(max_rows * features), Device::CUDA);
  Buffer logits(static_cast<size_t>(max_rows * classes), Device::CUDA);
  Buffer dlogits(static_cast<size_t>(max_rows * classes), Device::CUDA);

  // The host arrays are reused and scribbled over right after each upload: upload() must have
  // taken its copy by then.
  std::vector<float> staging_x;
  std::vector<int32_t> staging_labels;
  auto upload = [&](size_t i) {
    staging_x = xs[i];
    staging_labels = labels[i];
    up.upload(staging_x.data(), staging_labels.data(), rows[i]);
    std::fill(staging_x.begin(), staging_x.end(), -1.0f);
    std::fill(staging_labels.begin(), staging_labels.end(), -1);
  };

  upload(0);
  for (size_t i = 0; i < batches; ++i) {
    INFO("batch " << i << " of " << rows[i] << " rows");
    const ddp::BatchUploader::DeviceBatch b = up.acquire();
    if (i + 1 < batches) upload(i + 1);
    REQUIRE(b.x.rows == rows[i]);
    REQUIRE(b.x.cols == features);
    REQUIRE(b.x.device == Device::CUDA);

    // Through a kernel on the backend's stream first (it must wait for the upload: a host copy
    // first would drain the copy stream and hide a missing wait), then straight back.
    std::vector<float> x_back(xs[i].size());
    Tensor x_back_view = host_view(x_back, rows[i], features);
    Tensor copied_view = Tensor::of(copied, rows[i], features);
    be->copy(b.x, copied_view);
    ddp::copy_tensor(copied_view, x_back_view);
    require_bitwise_equal(x_back, xs[i], "x through the backend's stream");
    std::fill(x_back.begin(), x_back.end(), 0.0f);
    ddp::copy_tensor(b.x, x_back_view);
    require_bitwise_equal(x_back, xs[i], "x copied back");

    std::vector<int32_t> labels_back(labels[i].size(), -2);
    ddp::cuda_copy_bytes(labels_back.data(), b.labels, labels_back.size() * sizeof(int32_t));
    CHECK(labels_back == labels[i]);
    // Equal logits: dlogits = 1/classes - onehot, so each row's one negative entry is its label.
    Tensor l = Tensor::of(logits, rows[i], classes), d = Tensor::of(dlogits, rows[i], classes);
    be->fill(l, 0.0f);
    be->softmax_xent(l, b.labels, 1.0f, &d);
    std::vector<float> d_host(static_cast<size_t>(rows[i] * classes));
    Tensor d_host_view = host_view(d_host, rows[i], classes);
    ddp::copy_tensor(d, d_host_view);
    std::vector<int32_t> labels_seen(labels[i].size(), -2);
    for (int64_t r = 0; r < rows[i]; ++r) {
      for (int64_t c = 0; c < classes; ++c)
        if (d_host[r * classes + c] < 0.0f) labels_seen[r] = static_cast<int32_t>(c);
    }
    CHECK(labels_seen == labels[i]);
  }
}

}  // namespace
