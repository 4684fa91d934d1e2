// The CPU's bf16 Linear kernels (cpu_mixed_linear.h). Each product is one GEMM over bf16
// operands with float32 accumulation; what differs between the two engines is only who sums
// the products (every product of two bf16 values is exact in float32).
#include "kernels/cpu/cpu_mixed_linear.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/float16.h"
#include "kernels/cpu/eigen_core.h"  // first: see there
#include "kernels/cpu/onednn_matmul.h"
#include "kernels/column_sum_order.h"

namespace ddp::cpu {

namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMajorMatrix>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;
using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;

std::string shape(const Tensor16& t) { return shape_string(t.rows, t.cols); }
std::string shape(const Tensor& t) { return shape_string(t.rows, t.cols); }

void require(bool ok, const char* op, const std::string& what) {
  DDP_CHECK(ok, "bf16 " << op << ": " << what);
}

void require_bf16(const char* op, const char* name, const Tensor16& t) {
  require(t.format == Half::Bf16 && t.device == Device::CPU && (t.data != nullptr || !t.numel()),
          op, std::string(name) + " must be bf16 in CPU memory");
}

// x [b,in] · w [out,in]ᵀ + bias [1,out] -> y [b,out].
void check_forward(const char* op, const Tensor16& x, const Tensor16& w, const Tensor& bias,
                   int64_t y_rows, int64_t y_cols) {
  require_bf16(op, "x", x);
  require_bf16(op, "w", w);
  require(x.cols == w.cols && bias.rows == 1 && bias.cols == w.rows && y_rows == x.rows &&
              y_cols == w.rows,
          op,
          "x " + shape(x) + ", w " + shape(w) + ", bias " + shape(bias) + ", y " +
              shape_string(y_rows, y_cols) + " do not fit y = x·wᵀ + bias");
}

void round_into(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}

// The float32 values of t, in `out` (resized as needed; the engine keeps it between calls).
float* widen(const Tensor16& t, std::vector<float>& out) {
  out.resize(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = bf16_to_float(t.data[i]);
  return out.data();
}

// dx = dx where relu_output > 0, else 0 (a select: inf/NaN behind a dead unit does not leak).
void mask_by_positive(const Tensor16& relu_output, Tensor16& dx) {
  for (int64_t i = 0; i < dx.numel(); ++i) {
    const bool live = bf16_to_float(relu_output.data[i]) > 0.0f;
    dx.data[i] = live ? dx.data[i] : uint16_t{0};
  }
}

// db (+)= column sums of dy in kernels/column_sum_order.h's order (the CUDA backend's bits):
// the rows in chunks, each chunk summed in batch order, the chunks' sums added in order.
void add_column_sums(const Tensor16& dy, bool accumulate, Tensor& db, std::vector<float>& work) {
  const auto cols = static_cast<size_t>(dy.cols);
  work.assign(3 * cols, 0.0f);  // the row widened, the chunk's sum, the total
  float* widened = work.data();
  RowVectorMap row(widened, dy.cols), chunk(widened + cols, dy.cols),
      total(widened + 2 * cols, dy.cols);
  const int64_t per = column_sum_chunk_rows(dy.rows);
  for (int64_t c = 0; c < kColumnSumChunks; ++c) {
    chunk.setZero();
    const int64_t end = std::min(dy.rows, (c + 1) * per);
    for (int64_t r = c * per; r < end; ++r) {
      const uint16_t* in = dy.data + r * dy.cols;
      for (size_t j = 0; j < cols; ++j) widened[j] = bf16_to_float(in[j]);
      chunk += row;
    }
    total += chunk;
  }
  RowVectorMap sums(db.data, db.cols);
  if (accumulate) {
    sums += total;
  } else {
    sums = total;
  }
}

// How the products are summed: oneDNN's bf16 matmul, or Eigen over widened operands.
class Bf16Linear final : public MixedLinear {
 public:
  // oneDNN only where the CPU multiplies bf16 natively: elsewhere it falls back on kernels that
  // emulate bf16 (or on its reference code), and Eigen over widened operands is the known cost.
  explicit Bf16Linear(bool onednn) : isa_(onednn_native_bf16_isa()) {
    if (onednn && !isa_.empty()) dnn_ = std::make_unique<OnednnMatmul>();
  }

  std::string describe() const override {
    if (dnn_) return "oneDNN (" + isa_ + ")";
    const char* widened = "Eigen over operands widened to float32, slower than fp32";
    if (!onednn_built()) return std::string(widened) + " (this build has no oneDNN)";
    if (isa_.empty())
      return std::string(widened) + " (this CPU has no AVX512-BF16 or AMX instructions)";
    return widened;
  }

  void round(const Tensor& x, Tensor16& y) override {
    require_bf16("round", "y", y);
    require(x.device == Device::CPU && x.rows == y.rows && x.cols == y.cols, "round",
            "x " + shape(x) + " and y " + shape(y) + " differ");
    round_into(x.data, y.data, x.numel());
  }

  void forward_relu(const Tensor16& x, const Tensor16& w, const Tensor& bias,
                    Tensor16& y) override {
    check_forward("forward_relu", x, w, bias, y.rows, y.cols);
    require_bf16("forward_relu", "y", y);
    if (dnn_) {
      dnn_->run(product(x.rows, w.rows, x.cols, false, true, MatType::BF16, true, true), x.data,
                w.data, bias.data, y.data);
      return;
    }
    MatrixMap out = eigen_forward(x, w, bias);
    out = (out.array() < 0.0f).select(0.0f, out.array());
    round_into(out.data(), y.data, y.numel());
  }

  void forward(const Tensor16& x, const Tensor16& w, const Tensor& bias, Tensor& y) override {
    check_forward("forward", x, w, bias, y.rows, y.cols);
    require(y.device == Device::CPU, "forward", "y must be in CPU memory");
    if (dnn_) {
      dnn_->run(product(x.rows, w.rows, x.cols, false, true, MatType::F32, true, false), x.data,
                w.data, bias.data, y.data);
      return;
    }
    MatrixMap(y.data, y.rows, y.cols) = eigen_forward(x, w, bias);
  }

  void backward_input_relu(const Tensor16& dy, const Tensor16& w, const Tensor16& relu_output,
                           Tensor16& dx) override {
    const char* op = "backward_input_relu";
    require_bf16(op, "dy", dy);
    require_bf16(op, "w", w);
    require_bf16(op, "relu_output", relu_output);
    require_bf16(op, "dx", dx);
    require(dy.cols == w.rows && dx.rows == dy.rows && dx.cols == w.cols &&
                relu_output.rows == dx.rows && relu_output.cols == dx.cols,
            op,
            "dy " + shape(dy) + ", w " + shape(w) + ", relu_output " + shape(relu_output) +
                ", dx " + shape(dx) + " do not fit dx = dy·w");
    if (dnn_) {
      dnn_->run(product(dy.rows, w.cols, dy.cols, false, false, MatType::BF16, false, false),
                dy.data, w.data, nullptr, dx.data);
    } else {
      MatrixMap out = scratch(c_, dx.rows, dx.cols);
      out.noalias() =
          MatrixMap(widen(dy, a_), dy.rows, dy.cols) * MatrixMap(widen(w, b_), w.rows, w.cols);
      round_into(out.data(), dx.data, dx.numel());
    }
    mask_by_positive(relu_output, dx);
  }

  void backward_params(const Tensor16& dy, const Tensor16& x, bool accumulate, Tensor& dw,
                       Tensor& db) override {
    const char* op = "backward_params";
    require_bf16(op, "dy", dy);
    require_bf16(op, "x", x);
    require(dy.rows == x.rows && dw.rows == dy.cols && dw.cols == x.cols && db.rows == 1 &&
                db.cols == dy.cols,
            op,
            "dy " + shape(dy) + ", x " + shape(x) + ", dw " + shape(dw) + ", db " + shape(db) +
                " do not fit dw = dyᵀ·x");
    if (dnn_) {
      MatmulShape s = product(dy.cols, x.cols, dy.rows, true, false, MatType::F32, false, false);
      s.accumulate = accumulate;
      dnn_->run(s, dy.data, x.data, nullptr, dw.data);
    } else {
      MatrixMap grad(dw.data, dw.rows, dw.cols);
      const MatrixMap dys(widen(dy, a_), dy.rows, dy.cols);
      const MatrixMap xs(widen(x, b_), x.rows, x.cols);
      if (accumulate) {
        grad.noalias() += dys.transpose() * xs;
      } else {
        grad.noalias() = dys.transpose() * xs;
      }
    }
    add_column_sums(dy, accumulate, db, c_);
  }

 private:
  static MatmulShape product(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, MatType c,
                             bool bias, bool relu) {
    MatmulShape s;
    s.m = m, s.n = n, s.k = k, s.trans_a = trans_a, s.trans_b = trans_b;
    s.a = MatType::BF16, s.b = MatType::BF16, s.c = c;
    s.bias = bias, s.relu = relu;
    return s;
  }

  static MatrixMap scratch(std::vector<float>& v, int64_t rows, int64_t cols) {
    v.resize(static_cast<size_t>(rows * cols));
    return MatrixMap(v.data(), rows, cols);
  }

  // Bias first and the product accumulated onto it (the fp32 backend's order), in c_.
  MatrixMap eigen_forward(const Tensor16& x, const Tensor16& w, const Tensor& bias) {
    MatrixMap out = scratch(c_, x.rows, w.rows);
    out.rowwise() = ConstRowVectorMap(bias.data, bias.cols);
    out.noalias() += MatrixMap(widen(x, a_), x.rows, x.cols) *
                     MatrixMap(widen(w, b_), w.rows, w.cols).transpose();
    return out;
  }

  std::string isa_;                    // oneDNN's native bf16 instructions here ("": none)
  std::unique_ptr<OnednnMatmul> dnn_;  // null: Eigen
  std::vector<float> a_, b_, c_;       // Eigen's widened operands and float32 results
};

}  // namespace

std::unique_ptr<MixedLinear> make_bf16_linear() { return std::make_unique<Bf16Linear>(true); }

std::unique_ptr<MixedLinear> make_bf16_linear_on_eigen() {
  return std::make_unique<Bf16Linear>(false);
}

}  // namespace ddp::cpu
