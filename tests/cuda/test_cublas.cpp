// The CUDA backend's three Linear-layer GEMMs against cublasSgemm on large and ragged shapes.
// Real devices only: cuBLAS has no CPU emulation, so tests/CMakeLists.txt leaves this file out
// of the emulated target.
#include <cublas_v2.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_support.h"

namespace {

using ddp_cuda_test::DeviceTensor;
using ddp_cuda_test::kNaN;
using ddp_cuda_test::kTol;
using ddp_cuda_test::random_floats;
using ddp_cuda_test::require_guards_intact;

#define REQUIRE_CUBLAS(call)                       \
  do {                                             \
    const cublasStatus_t ddp_status_ = (call);     \
    INFO(#call << " returned " << ddp_status_);    \
    REQUIRE(ddp_status_ == CUBLAS_STATUS_SUCCESS); \
  } while (0)

/// A cuBLAS handle on the legacy default stream, which is ordered with the backend's blocking
/// stream and with the synchronous copies the tests download through.
class CublasHandle {
 public:
  CublasHandle() {
    REQUIRE_CUBLAS(cublasCreate(&handle_));
    // Pedantic math: IEEE fp32 multiplies and adds in every phase. The default mode already
    // avoids TF32 today, but pedantic is the mode cuBLAS documents for numerical testing and
    // also rules out reduced-precision shortcuts, so the reference stays plain fp32 whatever
    // the library's defaults become.
    REQUIRE_CUBLAS(cublasSetMathMode(handle_, CUBLAS_PEDANTIC_MATH));
  }
  ~CublasHandle() { cublasDestroy(handle_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

/// Finite, and ||got - want|| <= tol·||want||.
void require_norm_close(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double diff2 = 0.0, want2 = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i]))
      FAIL("element " << i << " is not finite: got " << got[i] << ", cuBLAS " << want[i]);
    const double d = double(got[i]) - want[i];
    diff2 += d * d;
    want2 += double(want[i]) * want[i];
  }
  const double rel = std::sqrt(diff2) / std::sqrt(want2);
  INFO("relative error " << rel);
  REQUIRE(want2 > 0.0);
  REQUIRE(rel <= kTol);
}

struct Shape {
  int64_t batch, in, out;
};

TEST_CASE("cuda Linear-layer GEMMs agree with cuBLAS in fp32", DDP_CUDA_TAGS "[cublas]") {
  auto be = ddp::make_cuda_backend(0);
  CublasHandle cublas;
  // Large, square, ragged, a long K that the backend splits, and batch 1.
  const std::vector<Shape> shapes = {
      {512, 384, 1000}, {1024, 1024, 1024}, {257, 129, 65}, {64, 4096, 64}, {1, 1024, 1000}};
  uint64_t seed = 11000;
  for (const Shape& s : shapes) {
    INFO("batch " << s.batch << ", in " << s.in << ", out " << s.out);
    const int b = static_cast<int>(s.batch), in = static_cast<int>(s.in),
              out = static_cast<int>(s.out);
    const std::vector<float> x = random_floats(static_cast<size_t>(b * in), seed += 10);
    const std::vector<float> w = random_floats(static_cast<size_t>(out * in), seed + 1, -0.5, 0.5);
    const std::vector<float> bias = random_floats(static_cast<size_t>(out), seed + 2);
    const std::vector<float> dy = random_floats(static_cast<size_t>(b * out), seed + 3);
    DeviceTensor dx_in(x, b, in), dw_in(w, out, in), dbias(bias, 1, out), ddy(dy, b, out);

    // Ours.
    DeviceTensor y(b, out), dx(b, in), dw(out, in), db(1, out);
    be->fill(y.view(), kNaN);
    be->fill(dx.view(), kNaN);
    be->fill(dw.view(), kNaN);
    be->linear_forward(dx_in.view(), dw_in.view(), dbias.view(), false, y.view());
    be->linear_backward_input(ddy.view(), dw_in.view(), nullptr, dx.view());
    be->linear_backward_params(ddy.view(), dx_in.view(), false, dw.view(), db.view());
    require_guards_intact(y, "y");
    require_guards_intact(dx, "dx");
    require_guards_intact(dw, "dw");

    // cuBLAS is column-major: a row-major [r, c] matrix is its transpose there, with ld = c.
    std::vector<float> bias_rows(static_cast<size_t>(b * out));
    for (int r = 0; r < b; ++r)
      for (int o = 0; o < out; ++o) bias_rows[static_cast<size_t>(r) * out + o] = bias[o];
    DeviceTensor y_ref(bias_rows, b, out), dx_ref(b, in), dw_ref(out, in);
    const float one = 1.0f, zero = 0.0f;
    // yᵀ[out, b] = W[out, in] · xᵀ[in, b] + biasᵀ (beta = 1 on the preset rows).
    REQUIRE_CUBLAS(cublasSgemm(cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, out, b, in, &one,
                               dw_in.view().data, in, dx_in.view().data, in, &one,
                               y_ref.view().data, out));
    // dxᵀ[in, b] = Wᵀ[in, out] · dyᵀ[out, b].
    REQUIRE_CUBLAS(cublasSgemm(cublas.get(), CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, &one,
                               dw_in.view().data, in, ddy.view().data, out, &zero,
                               dx_ref.view().data, in));
    // dWᵀ[in, out] = xᵀ[in, b] · dy[b, out].
    REQUIRE_CUBLAS(cublasSgemm(cublas.get(), CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, &one,
                               dx_in.view().data, in, ddy.view().data, out, &zero,
                               dw_ref.view().data, in));

    require_norm_close(y.download(), y_ref.download(), "linear_forward vs cublasSgemm");
    require_norm_close(dx.download(), dx_ref.download(), "linear_backward_input vs cublasSgemm");
    require_norm_close(dw.download(), dw_ref.download(), "linear_backward_params vs cublasSgemm");
  }
}

}  // namespace
