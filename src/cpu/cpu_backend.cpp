// The CPU backend: every kernel of include/ddp/backend.h over our own float buffers, mapped with
// Eigen (row-major, never Eigen-owned storage). Single-threaded by design: the library is built
// with EIGEN_DONT_PARALLELIZE because one rank per core is the parallelism.

#include "eigen_core.h"  // first: see there

#if defined(__SSE2__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "ddp/backend.h"
#include "ddp/check.h"

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

std::string describe(const char* name, const Tensor& t) {
  return std::string(name) + " " + shape_string(t.rows, t.cols);
}

// Every kernel argument must be a CPU view with a sane shape; a CUDA pointer here would crash
// far from the mistake, so it is reported at the call.
void check_cpu(const char* op, const char* name, const Tensor& t) {
  DDP_CHECK(t.device == Device::CPU, op << ": " << name << " is a " << device_name(t.device)
                                        << " tensor, the cpu backend needs cpu tensors");
  DDP_CHECK(t.rows >= 0 && t.cols >= 0,
            op << ": " << describe(name, t) << " has a negative extent");
  DDP_CHECK(t.data != nullptr || t.numel() == 0, op << ": " << describe(name, t) << " has no data");
}

// Products write through .noalias(): an output that overlaps an input would be read after it
// was overwritten, so overlap is rejected instead of silently giving garbage.
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const float* a_end = a.data + a.numel();
  const float* b_end = b.data + b.numel();
  return a.data < b_end && b.data < a_end;
}

void check_disjoint(const char* op, const char* out_name, const Tensor& out, const char* in_name,
                    const Tensor& in) {
  DDP_CHECK(!overlaps(out, in),
            op << ": output " << out_name << " overlaps input " << in_name << " (not supported)");
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  const char* name() const override { return "cpu"; }

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool fuse_relu,
                      Tensor& y) override {
    check_linear_forward(x, w, bias, y);
    MatrixMap out = as_matrix(y);
    // Bias first and the product accumulated onto it: BLAS's beta = 1 form, one pass over y.
    out.rowwise() = ConstRowVectorMap(bias.data, bias.cols);
    out.noalias() += as_matrix(x) * as_matrix(w).transpose();
    if (fuse_relu) relu_in_place(y);
  }

  void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor* relu_output,
                             Tensor& dx) override {
    check_linear_backward_input(dy, w, relu_output, dx);
    as_matrix(dx).noalias() = as_matrix(dy) * as_matrix(w);
    if (relu_output != nullptr) mask_by_positive(*relu_output, dx, dx);
  }

  void linear_backward_params(const Tensor& dy, const Tensor& x, bool accumulate, Tensor& dw,
                              Tensor& db) override {
    check_linear_backward_params(dy, x, dw, db);
    MatrixMap grad_w = as_matrix(dw);
    if (accumulate) {
      grad_w.noalias() += as_matrix(dy).transpose() * as_matrix(x);
    } else {
      grad_w.noalias() = as_matrix(dy).transpose() * as_matrix(x);
    }
    add_column_sums(dy, accumulate, db);
  }

  void relu_forward(const Tensor& x, Tensor& y) override {
    check_same_shape("relu_forward", "x", x, "y", y);
    if (y.data != x.data) as_array(y) = as_array(x);
    relu_in_place(y);
  }

  void relu_backward(const Tensor& dy, const Tensor& y, Tensor& dx) override {
    check_same_shape("relu_backward", "dy", dy, "y", y);
    check_same_shape("relu_backward", "dy", dy, "dx", dx);
    mask_by_positive(y, dy, dx);
  }

  XentResult softmax_xent(const Tensor& logits, const int32_t* labels, float grad_scale,
                          Tensor* dlogits) override;

  void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdOptions& opt,
                bool first_step) override;

  void fill(Tensor& t, float value) override {
    check_cpu("fill", "t", t);
    as_array(t).setConstant(value);
  }

  void scale(Tensor& t, float factor) override {
    check_cpu("scale", "t", t);
    as_array(t) *= factor;
  }

  void copy(const Tensor& src, Tensor& dst) override {
    check_same_shape("copy", "src", src, "dst", dst);
    if (src.data == dst.data) return;
    check_disjoint("copy", "dst", dst, "src", src);
    as_array(dst) = as_array(src);
  }

 private:
  static void check_same_shape(const char* op, const char* a_name, const Tensor& a,
                               const char* b_name, const Tensor& b) {
    check_cpu(op, a_name, a);
    check_cpu(op, b_name, b);
    DDP_CHECK(a.rows == b.rows && a.cols == b.cols,
              op << ": shapes differ: " << describe(a_name, a) << ", " << describe(b_name, b));
  }

  // For kernels over flat arrays (sgd_step): only the element counts must agree.
  static void check_same_size(const char* op, const char* a_name, const Tensor& a,
                              const char* b_name, const Tensor& b) {
    check_cpu(op, a_name, a);
    check_cpu(op, b_name, b);
    DDP_CHECK(a.numel() == b.numel(), op << ": sizes differ: " << describe(a_name, a) << " has "
                                         << a.numel() << " elements, " << describe(b_name, b)
                                         << " has " << b.numel());
  }

  static void check_linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                   const Tensor& y);
  static void check_linear_backward_input(const Tensor& dy, const Tensor& w,
                                          const Tensor* relu_output, const Tensor& dx);
  static void check_linear_backward_params(const Tensor& dy, const Tensor& x, const Tensor& dw,
                                           const Tensor& db);

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

void CpuBackend::check_linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Tensor& y) {
  const char* op = "linear_forward";
  check_cpu(op, "x", x);
  check_cpu(op, "w", w);
  check_cpu(op, "bias", bias);
  check_cpu(op, "y", y);
  DDP_CHECK(x.cols == w.cols && bias.rows == 1 && bias.cols == w.rows && y.rows == x.rows &&
                y.cols == w.rows,
            op << ": shapes do not match: " << describe("x", x) << ", " << describe("w", w) << ", "
               << describe("bias", bias) << ", " << describe("y", y)
               << " (expected x [b, in], w [out, in], bias [1, out], y [b, out])");
  check_disjoint(op, "y", y, "x", x);
  check_disjoint(op, "y", y, "w", w);
  check_disjoint(op, "y", y, "bias", bias);
}

void CpuBackend::check_linear_backward_input(const Tensor& dy, const Tensor& w,
                                             const Tensor* relu_output, const Tensor& dx) {
  const char* op = "linear_backward_input";
  check_cpu(op, "dy", dy);
  check_cpu(op, "w", w);
  check_cpu(op, "dx", dx);
  DDP_CHECK(dy.cols == w.rows && dx.rows == dy.rows && dx.cols == w.cols,
            op << ": shapes do not match: " << describe("dy", dy) << ", " << describe("w", w)
               << ", " << describe("dx", dx) << " (expected dy [b, out], w [out, in], dx [b, in])");
  check_disjoint(op, "dx", dx, "dy", dy);
  check_disjoint(op, "dx", dx, "w", w);
  if (relu_output == nullptr) return;
  check_cpu(op, "relu_output", *relu_output);
  DDP_CHECK(relu_output->rows == dx.rows && relu_output->cols == dx.cols,
            op << ": " << describe("relu_output", *relu_output) << " must have the shape of "
               << describe("dx", dx));
  check_disjoint(op, "dx", dx, "relu_output", *relu_output);
}

void CpuBackend::check_linear_backward_params(const Tensor& dy, const Tensor& x, const Tensor& dw,
                                              const Tensor& db) {
  const char* op = "linear_backward_params";
  check_cpu(op, "dy", dy);
  check_cpu(op, "x", x);
  check_cpu(op, "dw", dw);
  check_cpu(op, "db", db);
  DDP_CHECK(dy.rows == x.rows && dw.rows == dy.cols && dw.cols == x.cols && db.rows == 1 &&
                db.cols == dy.cols,
            op << ": shapes do not match: " << describe("dy", dy) << ", " << describe("x", x)
               << ", " << describe("dw", dw) << ", " << describe("db", db)
               << " (expected dy [b, out], x [b, in], dw [out, in], db [1, out])");
  check_disjoint(op, "dw", dw, "dy", dy);
  check_disjoint(op, "dw", dw, "x", x);
  check_disjoint(op, "db", db, "dy", dy);
  check_disjoint(op, "db", db, "dw", dw);
}

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
  check_cpu(op, "logits", logits);
  DDP_CHECK(logits.cols >= 1, op << ": " << describe("logits", logits) << " has no classes");
  DDP_CHECK(labels != nullptr || logits.rows == 0, op << ": labels is null");
  if (dlogits != nullptr) check_same_shape(op, "logits", logits, "dlogits", *dlogits);
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

// torch.optim.SGD, element for element. Every torch `a.add(b, alpha=s)` is one fused
// multiply-add in ATen's vectorised CPU kernel (vec::fmadd(b, s, a)) and under nvcc's default
// contraction, so it is std::fma here too; buf.mul_(momentum) is a plain multiply. Scalars are
// rounded to float as torch does (1 - dampening is formed in double first, as in Python).
void CpuBackend::sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf,
                          const SgdOptions& opt, bool first_step) {
  const char* op = "sgd_step";
  const bool use_momentum = opt.momentum != 0.0f;
  check_same_size(op, "params", params, "grads", grads);
  if (use_momentum) check_same_size(op, "params", params, "momentum_buf", momentum_buf);
  DDP_CHECK(!opt.nesterov || (opt.momentum > 0.0f && opt.dampening == 0.0f),
            op << ": nesterov needs momentum > 0 and dampening == 0 (got momentum " << opt.momentum
               << ", dampening " << opt.dampening << ")");
  const float lr = opt.lr, wd = opt.weight_decay, momentum = opt.momentum;
  const float keep = static_cast<float>(1.0 - static_cast<double>(opt.dampening));
  float* p = params.data;
  const float* grad = grads.data;
  float* buf = momentum_buf.data;
  const int64_t n = params.numel();
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i];
    if (wd != 0.0f) g = std::fma(p[i], wd, g);
    if (use_momentum) {
      buf[i] = first_step ? g : std::fma(g, keep, buf[i] * momentum);
      g = opt.nesterov ? std::fma(buf[i], momentum, g) : buf[i];
    }
    p[i] = std::fma(g, -lr, p[i]);
  }
}

}  // namespace

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
