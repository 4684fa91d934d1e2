// The CPU backend: every kernel of src/kernels/backend.h over our own float buffers, mapped with
// Eigen (row-major, never Eigen-owned storage). Single-threaded by design: the library is built
// with EIGEN_DONT_PARALLELIZE because one rank per core is the parallelism.

#include "kernels/cpu/eigen_core.h"  // first: see there

#if defined(__SSE2__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "core/check.h"
#include "kernels/backend.h"
#include "kernels/backend_checks.h"
#include "kernels/cpu/cpu_mixed_linear.h"
#include "kernels/cpu/cpu_optimizers.h"
#include "kernels/cpu/onednn_matmul.h"

namespace ddp {

namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMajorMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix>;
using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;
using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;

MatrixMap as_matrix(Tensor& t) { return MatrixMap(t.data, t.rows, t.cols); }
ConstMatrixMap as_matrix(const Tensor& t) { return ConstMatrixMap(t.data, t.rows, t.cols); }
ArrayMap as_array(Tensor& t) { return ArrayMap(t.data, t.numel()); }
ConstArrayMap as_array(const Tensor& t) { return ConstArrayMap(t.data, t.numel()); }

constexpr Device kCpu = Device::CPU;
using cpu::MatmulShape;

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  const char* name() const override { return "cpu"; }

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool fuse_relu,
                      Tensor& y) override {
    checks::linear_forward(x, w, bias, y, kCpu);
    if (use_onednn(x.rows, w.rows, x.cols)) {
      MatmulShape s = f32_product(x.rows, w.rows, x.cols, false, true);
      s.bias = true, s.relu = fuse_relu;
      dnn_->run(s, x.data, w.data, bias.data, y.data);
      return;
    }
    MatrixMap out = as_matrix(y);
    // Bias first and the product accumulated onto it: BLAS's beta = 1 form, one pass over y.
    out.rowwise() = ConstRowVectorMap(bias.data, bias.cols);
    out.noalias() += as_matrix(x) * as_matrix(w).transpose();
    if (fuse_relu) relu_in_place(y);
  }

  void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor* relu_output,
                             Tensor& dx) override {
    checks::linear_backward_input(dy, w, relu_output, dx, kCpu);
    if (use_onednn(dy.rows, w.cols, dy.cols)) {
      dnn_->run(f32_product(dy.rows, w.cols, dy.cols, false, false), dy.data, w.data, nullptr,
                dx.data);
    } else {
      as_matrix(dx).noalias() = as_matrix(dy) * as_matrix(w);
    }
    if (relu_output != nullptr) mask_by_positive(*relu_output, dx, dx);
  }

  void linear_backward_params(const Tensor& dy, const Tensor& x, bool accumulate, Tensor& dw,
                              Tensor& db) override {
    checks::linear_backward_params(dy, x, dw, db, kCpu);
    MatrixMap grad_w = as_matrix(dw);
    if (use_onednn(dy.cols, x.cols, dy.rows)) {
      MatmulShape s = f32_product(dy.cols, x.cols, dy.rows, true, false);
      s.accumulate = accumulate;
      dnn_->run(s, dy.data, x.data, nullptr, dw.data);
    } else if (accumulate) {
      grad_w.noalias() += as_matrix(dy).transpose() * as_matrix(x);
    } else {
      grad_w.noalias() = as_matrix(dy).transpose() * as_matrix(x);
    }
    add_column_sums(dy, accumulate, db);
  }

  void relu_forward(const Tensor& x, Tensor& y) override {
    checks::same_shape("relu_forward", "x", x, "y", y, kCpu);
    if (y.data != x.data) as_array(y) = as_array(x);
    relu_in_place(y);
  }

  void relu_backward(const Tensor& dy, const Tensor& y, Tensor& dx) override {
    checks::same_shape("relu_backward", "dy", dy, "y", y, kCpu);
    checks::same_shape("relu_backward", "dy", dy, "dx", dx, kCpu);
    mask_by_positive(y, dy, dx);
  }

  XentResult softmax_xent(const Tensor& logits, const int32_t* labels, float grad_scale,
                          Tensor* dlogits) override;

  // bf16 only: fp16 products need fp16 units and loss scaling, a GPU's (training.precision).
  MixedLinear* mixed_linear(Half format) override {
    if (format != Half::Bf16) return nullptr;
    if (!bf16_) bf16_ = cpu::make_bf16_linear();
    return bf16_.get();
  }

  void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdOptions& opt,
                bool first_step) override {
    checks::sgd_step(params, grads, momentum_buf, opt, kCpu);
    cpu::sgd_step(params, grads, momentum_buf, opt, first_step);
  }

  void adam_step(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
                 Tensor& max_exp_avg_sq, const AdamStep& s) override {
    checks::adam_step(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, s, kCpu);
    cpu::adam_step(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, s);
  }

  void fill(Tensor& t, float value) override {
    checks::tensor("fill", "t", t, kCpu);
    as_array(t).setConstant(value);
  }

  int64_t count_nonfinite(const Tensor& t) override {
    checks::tensor("count_nonfinite", "t", t, kCpu);
    // Runs every step over every gradient: first one vectorised pass whose sum is NaN exactly
    // when some value is NaN or infinite (x * 0 is 0 for every finite x, so nothing overflows),
    // and only then the exact count.
    const auto a = as_array(t);
    if (std::isfinite((a * 0.0f).sum())) return 0;
    return static_cast<int64_t>((!a.isFinite()).count());
  }

  double l2_norm(const Tensor& t) override {
    checks::tensor("l2_norm", "t", t, kCpu);
    return cpu::l2_norm(t);
  }

  void scale(Tensor& t, float factor) override {
    checks::tensor("scale", "t", t, kCpu);
    as_array(t) *= factor;
  }

  void copy(const Tensor& src, Tensor& dst) override {
    checks::same_shape("copy", "src", src, "dst", dst, kCpu);
    if (src.data == dst.data) return;
    checks::disjoint("copy", "dst", dst, "src", src);
    as_array(dst) = as_array(src);
  }

 private:
  // C[m,n] = op(A)·op(B) in float32 on oneDNN (A [m,k], or [k,m] stored with trans_a; B [k,n],
  // or [n,k] with trans_b).
  static MatmulShape f32_product(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
    MatmulShape s;
    s.m = m, s.n = n, s.k = k, s.trans_a = trans_a, s.trans_b = trans_b;
    return s;
  }

  // oneDNN's float32 matmul where the build has oneDNN (~1.45x Eigen's GEMMs at the model's
  // shapes on AVX-512, docs/performance.md), except for products too small to pay for its
  // per-call cost (the seed model's: Eigen's are 25% faster there); else Eigen. The choice
  // depends on the shape alone, so the bits stay a function of the config.
  bool use_onednn(int64_t m, int64_t n, int64_t k) const {
    constexpr int64_t kSmallestProduct = int64_t{1} << 16;  // multiply-adds, ~40^3
    return dnn_ != nullptr && m * n * k >= kSmallestProduct;
  }
  std::unique_ptr<cpu::OnednnMatmul> dnn_ =
      cpu::onednn_built() ? std::make_unique<cpu::OnednnMatmul>() : nullptr;
  std::unique_ptr<MixedLinear> bf16_;  // made on first use

  // max(t, 0) that keeps NaN (like torch.relu), so a diverged step still shows up as a NaN loss.
  static void relu_in_place(Tensor& t) {
    ArrayMap a = as_array(t);
    a = (a < 0.0f).select(0.0f, a);
  }

  // out = in where positive > 0, else exactly 0 (torch's threshold_backward: a select, not a
  // multiply, so an inf/NaN gradient behind a dead unit does not leak through as NaN).
  static void mask_by_positive(const Tensor& positive, const Tensor& in, Tensor& out) {
    ArrayMap o = as_array(out);
    o = (as_array(positive) > 0.0f).select(as_array(in), 0.0f);
  }

  // db = column sums of dy, added row by row in batch order: vectorised across columns and
  // independent of memory alignment, so the result is bitwise reproducible.
  static void add_column_sums(const Tensor& dy, bool accumulate, Tensor& db) {
    RowVectorMap sums(db.data, db.cols);
    if (!accumulate) sums.setZero();
    ConstMatrixMap rows = as_matrix(dy);
    for (int64_t r = 0; r < dy.rows; ++r) sums += rows.row(r);
  }
};

// One row of softmax cross-entropy: returns the row's loss and whether its first argmax is the
// label, and writes the row's dlogits when d is given. Scalar loops on purpose: classes are few
// (10 for MNIST), and std::exp on every element keeps the result independent of the row's memory
// alignment (Eigen's vectorised exp computes peeled head/tail elements with another routine).
std::pair<double, bool> xent_row(const float* l, int64_t classes, int32_t label, float grad_scale,
                                 float* d) {
  float max_value = l[0];
  int64_t argmax = 0;
  for (int64_t j = 1; j < classes; ++j) {
    if (l[j] > max_value) {  // strict: a tie keeps the first index, like torch.argmax
      max_value = l[j];
      argmax = j;
    }
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < classes; ++j) sum += std::exp(l[j] - max_value);
  const float lse = max_value + std::log(sum);
  const double loss = static_cast<double>(lse) - static_cast<double>(l[label]);
  // d is written after the last read of l, so dlogits may alias logits.
  for (int64_t j = 0; d != nullptr && j < classes; ++j) {
    float p = std::exp(l[j] - lse);
    if (j == label) p -= 1.0f;
    d[j] = p * grad_scale;
  }
  return {loss, argmax == label};
}

XentResult CpuBackend::softmax_xent(const Tensor& logits, const int32_t* labels, float grad_scale,
                                    Tensor* dlogits) {
  const char* op = "softmax_xent";
  checks::softmax_xent(logits, labels, dlogits, kCpu);
  const int64_t classes = logits.cols;
  XentResult result;
  for (int64_t r = 0; r < logits.rows; ++r) {
    const int32_t label = labels[r];
    DDP_CHECK(label >= 0 && label < classes,
              op << ": row " << r << " has label " << label << ", outside [0, " << classes << ")");
    float* d = dlogits != nullptr ? dlogits->data + r * classes : nullptr;
    const auto [loss, correct] = xent_row(logits.data + r * classes, classes, label, grad_scale, d);
    result.loss_sum += loss;
    result.correct += correct ? 1 : 0;
  }
  return result;
}

}  // namespace

void Backend::softmax_xent_deferred(const Tensor& logits, const int32_t* labels, float grad_scale,
                                    Tensor* dlogits, int slot) {
  DDP_CHECK(slot == 0 || slot == 1, "softmax_xent_deferred: slot " << slot << " (0 or 1)");
  const XentResult r = softmax_xent(logits, labels, grad_scale, dlogits);
  xent_slots_[slot].loss_sum += r.loss_sum;
  xent_slots_[slot].correct += r.correct;
}

XentResult Backend::take_xent_totals(int slot) {
  DDP_CHECK(slot == 0 || slot == 1, "take_xent_totals: slot " << slot << " (0 or 1)");
  const XentResult r = xent_slots_[slot];
  xent_slots_[slot] = XentResult{};
  return r;
}

void Backend::clip_grad_norm_deferred(Tensor& t, double max_norm, int slot) {
  DDP_CHECK(slot == 0 || slot == 1, "clip_grad_norm_deferred: slot " << slot << " (0 or 1)");
  const double norm = l2_norm(t);
  norm_slots_[slot] = norm;
  if (!(max_norm > 0)) return;
  const float coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0f) scale(t, coef);  // torch multiplies by the clamped factor: 1 changes nothing
}

double Backend::take_grad_norm(int slot) {
  DDP_CHECK(slot == 0 || slot == 1, "take_grad_norm: slot " << slot << " (0 or 1)");
  return norm_slots_[slot];
}

void Backend::begin_graph() {
  DDP_THROW("the " << name() << " backend captures no graphs (training.cuda_graphs is for GPUs)");
}

std::unique_ptr<DeviceGraph> Backend::end_graph(bool) {
  DDP_THROW("the " << name() << " backend captures no graphs");
}

bool Backend::launch_graph(DeviceGraph&) {
  DDP_THROW("the " << name() << " backend captures no graphs");
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

bool set_flush_denormals(bool on) {
#if defined(__SSE2__)
  _MM_SET_FLUSH_ZERO_MODE(on ? _MM_FLUSH_ZERO_ON : _MM_FLUSH_ZERO_OFF);
  _MM_SET_DENORMALS_ZERO_MODE(on ? _MM_DENORMALS_ZERO_ON : _MM_DENORMALS_ZERO_OFF);
  return true;
#else
  (void)on;
  return false;
#endif
}

}  // namespace ddp
