// The CUDA backend's class, for the parts of the library that need its stream (the batch
// uploader now, the NCCL communicator's events later). Everyone else holds it as a Backend.
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/event_clock.h"
#include "kernels/cuda/kernel_args.h"

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
  void adam_step(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
                 Tensor& max_exp_avg_sq, const AdamStep& s) override;
  void softmax_xent_deferred(const Tensor& logits, const int32_t* labels, float grad_scale,
                             Tensor* dlogits, int slot) override;
  XentResult take_xent_totals(int slot) override;
  double l2_norm(const Tensor& t) override;
  /// Both passes of the norm, the clip factor and the scaling stay on the device; the norm's
  /// copy to the host is queued before the scaling, so take_grad_norm does not wait for it.
  void clip_grad_norm_deferred(Tensor& t, double max_norm, int slot) override;
  double take_grad_norm(int slot) override;
  int64_t count_nonfinite(const Tensor& t) override;
  void fill(Tensor& t, float value) override;
  void scale(Tensor& t, float factor) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void synchronize() override;
  /// CUDA graphs: stream capture on this backend's stream (thread-local mode: this thread may
  /// make no call that could synchronise with the captured work, nor allocate). Inside a
  /// capture the deferred results' events are not recorded: a launch records them after the
  /// graph, so take_xent_totals / take_grad_norm wait for the whole replay.
  bool captures_graphs() const override { return true; }
  void begin_graph() override;
  std::unique_ptr<DeviceGraph> end_graph(bool discard = false) override;
  bool launch_graph(DeviceGraph& graph) override;
  /// bf16 and fp16 on the tensor cores (cuda_mixed_linear.h). bf16 needs compute capability
  /// 8.0 or newer: on an older device the request throws ddp::Error naming training.precision
  /// and the device (fp16 runs there).
  MixedLinear* mixed_linear(Half format) override;

  /// Gradient compression's casts, queued on `stream` (this backend's or another stream of its
  /// device, such as a communicator's): out[i] = in[i] rounded to `type` (core/float16.h), and
  /// back, exactly, for i in [0, n).
  void cast_to_16bit(Float16Type type, const float* in, int64_t n, uint16_t* out,
                     cudaStream_t stream);
  void cast_from_16bit(Float16Type type, const uint16_t* in, int64_t n, float* out,
                       cudaStream_t stream);

  /// The stream every kernel of this backend is queued on.
  cudaStream_t stream() const { return stream_; }
  int ordinal() const { return device_; }
  int sm_count() const { return sm_count_; }
  void force_gemm_plan(const GemmPlan* plan);
  /// The device's event clock (made on first use), shared with the communicators' streams.
  std::shared_ptr<EventClock> clock();

 private:
  // One GEMM with the plan for its shape; vectorizable says whether the operands allow it.
  void gemm(const GemmArgs& args, bool a_k_contiguous, bool b_k_contiguous, bool vectorizable);
  // Grow-only scratch: after the first step of a given size nothing is allocated. Each growth
  // moves the scratch and makes every graph captured before it stale (scratch_generation_).
  float* gemm_workspace(int64_t floats);
  float* column_sum_scratch(int64_t floats);
  XentRowOut xent_scratch(int64_t rows);
  // Checks shapes and that the labels live on the device; returns the class count.
  int check_xent(const Tensor& logits, const int32_t* labels, Tensor* dlogits);

  int device_ = 0;
  int sm_count_ = 1;
  int compute_major_ = 0, compute_minor_ = 0;
  std::unique_ptr<MixedLinear> mixed_[2];  // bf16, fp16: made on first use
  cudaStream_t stream_ = nullptr;
  bool plan_forced_ = false;
  GemmPlan forced_plan_;
  std::shared_ptr<EventClock> clock_;
  DeviceArray<float> gemm_workspace_;
  DeviceArray<float> column_sum_partials_;  // the bias gradient's per-chunk column sums
  DeviceArray<double> xent_loss_;
  DeviceArray<int> xent_status_;
  DeviceArray<XentTotals> xent_partials_;  // the totals' first-pass blocks, kXentMaxTotalBlocks
  DeviceArray<XentTotals> xent_totals_;
  PinnedArray<XentTotals> xent_totals_host_;
  // Deferred totals: per slot, the device accumulator, its host copy and the event after the
  // copy; `fresh` means the next deferred batch starts the slot over instead of adding to it.
  DeviceArray<XentTotals> slot_totals_;
  PinnedArray<XentTotals> slot_totals_host_;
  cudaEvent_t slot_copied_[2] = {nullptr, nullptr};
  DeviceArray<unsigned long long> nonfinite_;
  PinnedArray<unsigned long long> nonfinite_host_;
  bool slot_fresh_[2] = {true, true};
  bool slot_pending_[2] = {false, false};
  // Gradient norms: the first pass's per-block sums; per result (0, 1: the deferred slots, 2:
  // l2_norm) the device result and its host copy; per slot the event after its copy.
  DeviceArray<double> norm_partials_;
  DeviceArray<NormResult> norm_results_;
  PinnedArray<NormResult> norm_results_host_;
  cudaEvent_t norm_copied_[2] = {nullptr, nullptr};
  bool norm_pending_[2] = {false, false};
  // Graph capture: whether one is open, and what it did to the deferred slots (bit s: slot s;
  // xent_fresh_: the slot started over rather than adding to its totals).
  bool capturing_ = false;
  unsigned captured_xent_ = 0, captured_norm_ = 0, captured_fresh_ = 0;
  uint64_t scratch_generation_ = 0;
};

}  // namespace cuda
}  // namespace ddp
