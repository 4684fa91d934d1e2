// The CUDA backend's MixedLinear (cuda_mixed_linear.h): argument checks with the CPU
// implementation's messages, then one WMMA GEMM per product (gemm16.cuh) with its epilogue,
// and for the parameter gradients the bias gradient's column sums, all on the backend's stream.
#include <string>

#include "core/check.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_mixed_linear.h"
#include "kernels/cuda/gemm16.cuh"

namespace ddp {
namespace cuda {

namespace {

std::string shape(const Tensor16& t) { return shape_string(t.rows, t.cols); }
std::string shape(const Tensor& t) { return shape_string(t.rows, t.cols); }

int as_int(int64_t v, const char* what) {
  DDP_CHECK(v >= 0 && v <= 0x7fffffff, what << " " << v << " is out of range for the CUDA kernels");
  return static_cast<int>(v);
}

class CudaMixedLinear final : public MixedLinear {
 public:
  CudaMixedLinear(Half format, CudaBackend& backend)
      : format_(format),
        type_(format == Half::Bf16 ? Float16Type::Bf16 : Float16Type::Fp16),
        name_(format == Half::Bf16 ? "bf16" : "fp16"),
        backend_(backend),
        stream_(backend.stream()) {}

  std::string describe() const override {
    return std::string("CUDA tensor cores (WMMA m16n16k16, ") + name_ + ")";
  }

  void round(const Tensor& x, Tensor16& y) override {
    require_half("round", "y", y);
    require(x.device == Device::CUDA && x.rows == y.rows && x.cols == y.cols, "round",
            "x " + shape(x) + " and y " + shape(y) + " differ");
    backend_.cast_to_16bit(type_, x.data, x.numel(), y.data, stream_);
  }

  void forward_relu(const Tensor16& x, const Tensor16& w, const Tensor& bias,
                    Tensor16& y) override {
    check_forward("forward_relu", x, w, bias, y.rows, y.cols);
    require_half("forward_relu", "y", y);
    Gemm16Args p = forward_args(x, w, bias);
    p.c16 = y.data;
    p.relu = true;
    run(p, true, true);
  }

  void forward(const Tensor16& x, const Tensor16& w, const Tensor& bias, Tensor& y) override {
    check_forward("forward", x, w, bias, y.rows, y.cols);
    require(y.device == Device::CUDA, "forward", "y must be in device memory");
    Gemm16Args p = forward_args(x, w, bias);
    p.c32 = y.data;
    run(p, true, true);
  }

  // dx[b,in] = dy[b,out]·w: A = dy (k-contiguous), B(k,n) = w[k][n] (n-contiguous).
  void backward_input_relu(const Tensor16& dy, const Tensor16& w, const Tensor16& relu_output,
                           Tensor16& dx) override {
    const char* op = "backward_input_relu";
    require_half(op, "dy", dy);
    require_half(op, "w", w);
    require_half(op, "relu_output", relu_output);
    require_half(op, "dx", dx);
    require(dy.cols == w.rows && dx.rows == dy.rows && dx.cols == w.cols &&
                relu_output.rows == dx.rows && relu_output.cols == dx.cols,
            op,
            "dy " + shape(dy) + ", w " + shape(w) + ", relu_output " + shape(relu_output) +
                ", dx " + shape(dx) + " do not fit dx = dy·w");
    Gemm16Args p;
    p.m = as_int(dy.rows, "batch");
    p.n = as_int(w.cols, "in_features");
    p.k = as_int(w.rows, "out_features");
    p.a = dy.data, p.lda = dy.cols;
    p.b = w.data, p.ldb = w.cols;
    p.c16 = dx.data, p.ldc = dx.cols;
    p.mask = relu_output.data;
    run(p, true, false);
  }

  // dw[out,in] (+)= dyᵀ·x: A(m,k) = dy[k][m] (m-contiguous), B(k,n) = x[k][n] (n-contiguous).
  void backward_params(const Tensor16& dy, const Tensor16& x, bool accumulate, Tensor& dw,
                       Tensor& db) override {
    const char* op = "backward_params";
    require_half(op, "dy", dy);
    require_half(op, "x", x);
    require(dy.rows == x.rows && dw.rows == dy.cols && dw.cols == x.cols && db.rows == 1 &&
                db.cols == dy.cols && dw.device == Device::CUDA && db.device == Device::CUDA,
            op,
            "dy " + shape(dy) + ", x " + shape(x) + ", dw " + shape(dw) + ", db " + shape(db) +
                " do not fit dw = dyᵀ·x in device memory");
    Gemm16Args p;
    p.m = as_int(dy.cols, "out_features");
    p.n = as_int(x.cols, "in_features");
    p.k = as_int(dy.rows, "batch");
    p.a = dy.data, p.lda = dy.cols;
    p.b = x.data, p.ldb = x.cols;
    p.c32 = dw.data, p.ldc = dw.cols;
    p.accumulate = accumulate;
    run(p, false, false);
    launch_column_sums16(type_, dy.data, dy.rows, dy.cols, accumulate, db.data, stream_);
  }

 private:
  void require(bool ok, const char* op, const std::string& what) const {
    DDP_CHECK(ok, name_ << " " << op << ": " << what);
  }

  void require_half(const char* op, const char* name, const Tensor16& t) const {
    require(t.format == format_ && t.device == Device::CUDA && (t.data != nullptr || !t.numel()),
            op, std::string(name) + " must be " + name_ + " in device memory");
  }

  // x [b,in] · w [out,in]ᵀ + bias [1,out] -> y [b,out].
  void check_forward(const char* op, const Tensor16& x, const Tensor16& w, const Tensor& bias,
                     int64_t y_rows, int64_t y_cols) const {
    require_half(op, "x", x);
    require_half(op, "w", w);
    require(x.cols == w.cols && bias.rows == 1 && bias.cols == w.rows && y_rows == x.rows &&
                y_cols == w.rows && bias.device == Device::CUDA,
            op,
            "x " + shape(x) + ", w " + shape(w) + ", bias " + shape(bias) + ", y " +
                shape_string(y_rows, y_cols) + " do not fit y = x·wᵀ + bias");
  }

  // y = x·wᵀ + bias: A = x (k-contiguous), B(k,n) = w[n][k] (k-contiguous).
  static Gemm16Args forward_args(const Tensor16& x, const Tensor16& w, const Tensor& bias) {
    Gemm16Args p;
    p.m = as_int(x.rows, "batch");
    p.n = as_int(w.rows, "out_features");
    p.k = as_int(w.cols, "in_features");
    p.a = x.data, p.lda = x.cols;
    p.b = w.data, p.ldb = w.cols;
    p.ldc = w.rows;
    p.bias = bias.data;
    return p;
  }

  void run(const Gemm16Args& p, bool a_kc, bool b_kc) {
    launch_gemm16(type_, p, a_kc, b_kc, gemm16_vectorizable(p, a_kc, b_kc), stream_);
  }

  Half format_;
  Float16Type type_;
  const char* name_;
  CudaBackend& backend_;  // the round's cast (the backend's kernels)
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<MixedLinear> make_mixed_linear(Half format, CudaBackend& backend) {
  return std::make_unique<CudaMixedLinear>(format, backend);
}

}  // namespace cuda
}  // namespace ddp
