// The CUDA backend's class, for the parts of the library that need its stream (the batch
// uploader now, the NCCL communicator's events later). Everyone else holds it as a Backend.
#pragma once

#include "cuda_api.h"
#include "ddp/backend.h"
#include "ddp/cuda.h"
#include "kernels/kernel_args.h"

namespace ddp {
namespace cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::CUDA; }
  const char* name() const override { return "cuda"; }

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool fuse_relu,
                      Tensor& y) override;
  void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor* relu_output,
                             Tensor& dx) override;
  void linear_backward_params(const Tensor& dy, const Tensor& x, bool accumulate, Tensor& dw,
                              Tensor& db) override;
  void relu_forward(const Tensor& x, Tensor& y) override;
  void relu_backward(const Tensor& dy, const Tensor& y, Tensor& dx) override;
  XentResult softmax_xent(const Tensor& logits, const int32_t* labels, float grad_scale,
                          Tensor* dlogits) override;
  void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdOptions& opt,
                bool first_step) override;
  void fill(Tensor& t, float value) override;
  void scale(Tensor& t, float factor) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void synchronize() override;

  /// The stream every kernel of this backend is queued on.
  cudaStream_t stream() const { return stream_; }
  int ordinal() const { return device_; }
  int sm_count() const { return sm_count_; }
  void force_gemm_plan(const GemmPlan* plan);

 private:
  // One GEMM with the plan for its shape; vectorizable says whether the operands allow it.
  void gemm(const GemmArgs& args, bool a_k_contiguous, bool b_k_contiguous, bool vectorizable);
  // Grow-only scratch: after the first step of a given size nothing is allocated.
  float* gemm_workspace(int64_t floats);
  XentRowOut xent_scratch(int64_t rows);

  int device_ = 0;
  int sm_count_ = 1;
  cudaStream_t stream_ = nullptr;
  bool plan_forced_ = false;
  GemmPlan forced_plan_;
  DeviceArray<float> gemm_workspace_;
  DeviceArray<double> xent_loss_;
  DeviceArray<int> xent_status_;
  DeviceArray<XentTotals> xent_totals_;
  PinnedArray<XentTotals> xent_totals_host_;
};

}  // namespace cuda
}  // namespace ddp
