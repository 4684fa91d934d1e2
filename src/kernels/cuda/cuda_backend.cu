// The CUDA backend: every kernel of src/kernels/backend.h as our own kernels
// (src/kernels/cuda/*.cuh), queued on one stream per backend, and gradient compression's casts
// on a stream the caller names. Arguments are checked like the CPU backend's (same messages);
// scratch memory grows to the largest batch seen and is then reused, so a steady training step
// allocates nothing. The host waits only for results it asks for: softmax_xent, l2_norm and
// count_nonfinite, and take_xent_totals / take_grad_norm for the deferred forms (which wait for
// that batch's totals or that norm alone).
#include <cstring>

#include "kernels/backend_checks.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_mixed_linear.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/float16_casts.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/reductions.cuh"

namespace ddp {
namespace cuda {

namespace {
constexpr Device kCuda = Device::CUDA;

bool all_aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

int as_int(int64_t v, const char* what) {
  DDP_CHECK(v >= 0 && v <= 0x7fffffff, what << " " << v << " is out of range for the CUDA kernels");
  return static_cast<int>(v);
}
}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  cuda_set_device(device);
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  DDP_CUDA_CHECK(
      cudaDeviceGetAttribute(&compute_major_, cudaDevAttrComputeCapabilityMajor, device));
  DDP_CUDA_CHECK(
      cudaDeviceGetAttribute(&compute_minor_, cudaDevAttrComputeCapabilityMinor, device));
  // A blocking stream: the default stream (synchronous copies of results) is ordered after it.
  DDP_CUDA_CHECK(cudaStreamCreate(&stream_));
  xent_totals_ = DeviceArray<XentTotals>(1);
  xent_partials_ = DeviceArray<XentTotals>(static_cast<size_t>(kXentMaxTotalBlocks));
  xent_totals_host_ = PinnedArray<XentTotals>(1);
  slot_totals_ = DeviceArray<XentTotals>(2);
  slot_totals_host_ = PinnedArray<XentTotals>(2);
  nonfinite_ = DeviceArray<unsigned long long>(1);
  nonfinite_host_ = PinnedArray<unsigned long long>(1);
  for (cudaEvent_t& e : slot_copied_)
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  norm_partials_ = DeviceArray<double>(kNormMaxBlocks);
  norm_results_ = DeviceArray<NormResult>(3);
  norm_results_host_ = PinnedArray<NormResult>(3);
  for (int i = 0; i < 3; ++i) norm_results_host_.data()[i] = NormResult{0.0, 1.0f};
  for (cudaEvent_t& e : norm_copied_)
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : slot_copied_)
    if (e != nullptr) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : norm_copied_)
    if (e != nullptr) (void)cudaEventDestroy(e);
}

void CudaBackend::synchronize() { DDP_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

namespace {
// An instantiated graph and what a launch must find and do besides running it: the scratch
// generation it was captured at, and the deferred slots it fills (bits as CudaBackend's).
struct CudaGraph final : DeviceGraph {
  cudaGraphExec_t exec = nullptr;
  uint64_t generation = 0;
  unsigned xent = 0, norm = 0, fresh = 0;
  ~CudaGraph() override {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
  }
};
}  // namespace

void CudaBackend::begin_graph() {
  DDP_CHECK(!capturing_, "begin_graph: a capture is already open on this backend");
  DDP_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  captured_xent_ = captured_norm_ = captured_fresh_ = 0;
}

std::unique_ptr<DeviceGraph> CudaBackend::end_graph(bool discard) {
  DDP_CHECK(capturing_, "end_graph: no capture is open on this backend");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (discard) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // the capture's own error is the one being reported
    return nullptr;
  }
  DDP_CUDA_CHECK(ended);
  auto captured = std::make_unique<CudaGraph>();
  const cudaError_t made = cudaGraphInstantiate(&captured->exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  DDP_CUDA_CHECK(made);
  captured->generation = scratch_generation_;
  captured->xent = captured_xent_;
  captured->norm = captured_norm_;
  captured->fresh = captured_fresh_;
  return captured;
}

bool CudaBackend::launch_graph(DeviceGraph& graph) {
  DDP_CHECK(!capturing_, "launch_graph: a capture is open on this backend");
  auto& g = dynamic_cast<CudaGraph&>(graph);
  if (g.generation != scratch_generation_) return false;
  for (int s = 0; s < 2; ++s) {
    const unsigned bit = 1u << s;
    if ((g.xent & bit) && slot_fresh_[s] != static_cast<bool>(g.fresh & bit)) return false;
  }
  DDP_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
  for (int s = 0; s < 2; ++s) {
    if (g.xent & (1u << s)) {
      DDP_CUDA_CHECK(cudaEventRecord(slot_copied_[s], stream_));
      slot_fresh_[s] = false;
      slot_pending_[s] = true;
    }
    if (g.norm & (1u << s)) {
      DDP_CUDA_CHECK(cudaEventRecord(norm_copied_[s], stream_));
      norm_pending_[s] = true;
    }
  }
  return true;
}

MixedLinear* CudaBackend::mixed_linear(Half format) {
  // The bf16 kernels of older architectures are traps (gemm16.cuh): refused here, before any.
  DDP_CHECK(format != Half::Bf16 || compute_major_ >= 8,
            "training.precision: bf16 needs a GPU of compute capability 8.0 or newer; device "
                << device_ << " is " << compute_major_ << "." << compute_minor_
                << " (use fp16 or fp32 there)");
  std::unique_ptr<MixedLinear>& k = mixed_[format == Half::Bf16 ? 0 : 1];
  if (!k) k = make_mixed_linear(format, *this);
  return k.get();
}

void CudaBackend::force_gemm_plan(const GemmPlan* plan) {
  plan_forced_ = plan != nullptr;
  if (plan != nullptr) {
    DDP_CHECK(plan->tile >= 0 && plan->tile <= 2 && plan->splits >= 1,
              "force_gemm_plan: tile " << plan->tile << " splits " << plan->splits
                                       << " (tile 0..2, splits >= 1)");
    forced_plan_ = *plan;
  }
}

std::shared_ptr<EventClock> CudaBackend::clock() {
  if (!clock_) clock_ = std::make_shared<EventClock>(stream_);
  return clock_;
}

float* CudaBackend::gemm_workspace(int64_t floats) {
  if (static_cast<size_t>(floats) > gemm_workspace_.size()) {
    gemm_workspace_ = DeviceArray<float>(static_cast<size_t>(floats));
    ++scratch_generation_;
  }
  return gemm_workspace_.data();
}

float* CudaBackend::column_sum_scratch(int64_t floats) {
  if (static_cast<size_t>(floats) > column_sum_partials_.size()) {
    column_sum_partials_ = DeviceArray<float>(static_cast<size_t>(floats));
    ++scratch_generation_;
  }
  return column_sum_partials_.data();
}

XentRowOut CudaBackend::xent_scratch(int64_t rows) {
  if (static_cast<size_t>(rows) > xent_loss_.size()) {
    xent_loss_ = DeviceArray<double>(static_cast<size_t>(rows));
    xent_status_ = DeviceArray<int>(static_cast<size_t>(rows));
    ++scratch_generation_;
  }
  return XentRowOut{xent_loss_.data(), xent_status_.data(), xent_partials_.data()};
}

void CudaBackend::gemm(const GemmArgs& args, bool a_k_contiguous, bool b_k_contiguous,
                       bool vectorizable) {
  GemmPlan plan =
      plan_forced_ ? forced_plan_ : plan_gemm(args.m, args.n, args.k, sm_count_, vectorizable);
  plan.vectorized = plan.vectorized && vectorizable;
  float* workspace = nullptr;
  const int64_t need = gemm_workspace_floats(plan, args.m, args.n);
  if (need > 0) workspace = gemm_workspace(need);
  launch_gemm(args, plan, a_k_contiguous, b_k_contiguous, workspace, stream_);
}

// y[b,out] = x[b,in]·wᵀ + bias: A = x (k-contiguous), B(k,n) = w[n][k] (k-contiguous).
void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 bool fuse_relu, Tensor& y) {
  checks::linear_forward(x, w, bias, y, kCuda);
  GemmArgs p;
  p.m = as_int(x.rows, "batch");
  p.n = as_int(w.rows, "out_features");
  p.k = as_int(w.cols, "in_features");
  p.a = x.data, p.lda = x.cols;
  p.b = w.data, p.ldb = w.cols;
  p.c = y.data, p.ldc = y.cols;
  p.bias = bias.data;
  p.relu = fuse_relu;
  const bool vec = p.k % 4 == 0 && p.n % 4 == 0 && all_aligned16({x.data, w.data, y.data});
  gemm(p, true, true, vec);
}

// dx[b,in] = dy[b,out]·w: A = dy (k-contiguous), B(k,n) = w[k][n] (n-contiguous).
void CudaBackend::linear_backward_input(const Tensor& dy, const Tensor& w,
                                        const Tensor* relu_output, Tensor& dx) {
  checks::linear_backward_input(dy, w, relu_output, dx, kCuda);
  GemmArgs p;
  p.m = as_int(dy.rows, "batch");
  p.n = as_int(w.cols, "in_features");
  p.k = as_int(w.rows, "out_features");
  p.a = dy.data, p.lda = dy.cols;
  p.b = w.data, p.ldb = w.cols;
  p.c = dx.data, p.ldc = dx.cols;
  p.mask = relu_output != nullptr ? relu_output->data : nullptr;
  const bool vec = p.k % 4 == 0 && p.n % 4 == 0 && all_aligned16({dy.data, w.data, dx.data});
  gemm(p, true, false, vec);
}

// dw[out,in] (+)= dyᵀ·x: A(m,k) = dy[k][m] (m-contiguous), B(k,n) = x[k][n] (n-contiguous);
// db (+)= column sums of dy.
void CudaBackend::linear_backward_params(const Tensor& dy, const Tensor& x, bool accumulate,
                                         Tensor& dw, Tensor& db) {
  checks::linear_backward_params(dy, x, dw, db, kCuda);
  GemmArgs p;
  p.m = as_int(dy.cols, "out_features");
  p.n = as_int(x.cols, "in_features");
  p.k = as_int(dy.rows, "batch");
  p.a = dy.data, p.lda = dy.cols;
  p.b = x.data, p.ldb = x.cols;
  p.c = dw.data, p.ldc = dw.cols;
  p.accumulate = accumulate;
  const bool vec = p.m % 4 == 0 && p.n % 4 == 0 && all_aligned16({dy.data, x.data, dw.data});
  gemm(p, false, false, vec);
  const int64_t scratch = column_sum_scratch_floats(dy.rows, dy.cols);
  float* partials = scratch > 0 ? column_sum_scratch(scratch) : nullptr;
  launch_column_sums(dy.data, dy.rows, dy.cols, accumulate, partials, db.data, stream_);
}

void CudaBackend::relu_forward(const Tensor& x, Tensor& y) {
  checks::same_shape("relu_forward", "x", x, "y", y, kCuda);
  launch_elementwise(ReluForwardOp{x.data, y.data}, x.numel(), all_aligned16({x.data, y.data}),
                     sm_count_, stream_);
}

void CudaBackend::relu_backward(const Tensor& dy, const Tensor& y, Tensor& dx) {
  checks::same_shape("relu_backward", "dy", dy, "y", y, kCuda);
  checks::same_shape("relu_backward", "dy", dy, "dx", dx, kCuda);
  launch_elementwise(ReluBackwardOp{dy.data, y.data, dx.data}, dy.numel(),
                     all_aligned16({dy.data, y.data, dx.data}), sm_count_, stream_);
}

int CudaBackend::check_xent(const Tensor& logits, const int32_t* labels, Tensor* dlogits) {
  checks::softmax_xent(logits, labels, dlogits, kCuda);
#if !defined(DDP_CUDA_EMULATION)
  if (labels != nullptr) {
    cudaPointerAttributes attr{};
    DDP_CUDA_CHECK(cudaPointerGetAttributes(&attr, labels));
    DDP_CHECK(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
              "softmax_xent: labels must be in device memory (see BatchUploader)");
  }
#endif
  return as_int(logits.cols, "classes");
}

XentResult CudaBackend::softmax_xent(const Tensor& logits, const int32_t* labels, float grad_scale,
                                     Tensor* dlogits) {
  const int classes = check_xent(logits, labels, dlogits);
  const XentRowOut scratch = xent_scratch(logits.rows);
  launch_softmax_xent(logits.data, labels, logits.rows, classes, grad_scale,
                      dlogits != nullptr ? dlogits->data : nullptr, scratch, false,
                      xent_totals_.data(), stream_);
  DDP_CUDA_CHECK(cudaMemcpyAsync(xent_totals_host_.data(), xent_totals_.data(), sizeof(XentTotals),
                                 cudaMemcpyDeviceToHost, stream_));
  // The loss is the one number the host needs every step (logging, divergence check).
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const XentTotals totals = *xent_totals_host_.data();
  DDP_CHECK(totals.first_bad_row < 0, "softmax_xent: row " << totals.first_bad_row << " has label "
                                                           << totals.bad_label << ", outside [0, "
                                                           << logits.cols << ")");
  XentResult result;
  result.loss_sum = totals.loss_sum;
  result.correct = totals.correct;
  return result;
}

void CudaBackend::softmax_xent_deferred(const Tensor& logits, const int32_t* labels,
                                        float grad_scale, Tensor* dlogits, int slot) {
  DDP_CHECK(slot == 0 || slot == 1, "softmax_xent_deferred: slot " << slot << " (0 or 1)");
  const int classes = check_xent(logits, labels, dlogits);
  const XentRowOut scratch = xent_scratch(logits.rows);
  const unsigned bit = 1u << slot;
  // In a capture the slot's state is the capture's: fresh as the launch will find it, until the
  // capture's first batch in it.
  const bool fresh =
      capturing_ ? (captured_xent_ & bit ? false : slot_fresh_[slot]) : slot_fresh_[slot];
  launch_softmax_xent(logits.data, labels, logits.rows, classes, grad_scale,
                      dlogits != nullptr ? dlogits->data : nullptr, scratch, !fresh,
                      slot_totals_.data() + slot, stream_);
  // A 32-byte copy behind every batch, so take_xent_totals waits for this batch and not for
  // whatever the host queued after it.
  DDP_CUDA_CHECK(cudaMemcpyAsync(slot_totals_host_.data() + slot, slot_totals_.data() + slot,
                                 sizeof(XentTotals), cudaMemcpyDeviceToHost, stream_));
  if (capturing_) {
    if (!(captured_xent_ & bit) && fresh) captured_fresh_ |= bit;
    captured_xent_ |= bit;
    return;  // the launch records the event and marks the slot
  }
  DDP_CUDA_CHECK(cudaEventRecord(slot_copied_[slot], stream_));
  slot_fresh_[slot] = false;
  slot_pending_[slot] = true;
}

XentResult CudaBackend::take_xent_totals(int slot) {
  DDP_CHECK(slot == 0 || slot == 1, "take_xent_totals: slot " << slot << " (0 or 1)");
  XentResult result;
  if (!slot_pending_[slot]) return result;
  DDP_CUDA_CHECK(cudaEventSynchronize(slot_copied_[slot]));
  const XentTotals totals = slot_totals_host_.data()[slot];
  slot_fresh_[slot] = true;
  slot_pending_[slot] = false;
  DDP_CHECK(totals.first_bad_row < 0, "softmax_xent: row " << totals.first_bad_row << " has label "
                                                           << totals.bad_label
                                                           << ", outside the model's classes");
  result.loss_sum = totals.loss_sum;
  result.correct = totals.correct;
  return result;
}

void CudaBackend::sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf,
                           const SgdOptions& opt, bool first_step) {
  checks::sgd_step(params, grads, momentum_buf, opt, kCuda);
  SgdOp op;
  op.p = params.data;
  op.g = grads.data;
  op.use_momentum = opt.momentum != 0.0f;
  op.buf = op.use_momentum ? momentum_buf.data : nullptr;
  op.lr = opt.lr;
  op.weight_decay = opt.weight_decay;
  op.momentum = opt.momentum;
  op.keep = static_cast<float>(1.0 - static_cast<double>(opt.dampening));
  op.nesterov = opt.nesterov;
  op.first_step = first_step;
  launch_elementwise(op, params.numel(), all_aligned16({op.p, op.g, op.buf}), sm_count_, stream_);
}

void CudaBackend::adam_step(Tensor& params, const Tensor& grads, Tensor& exp_avg,
                            Tensor& exp_avg_sq, Tensor& max_exp_avg_sq, const AdamStep& s) {
  checks::adam_step(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, s, kCuda);
  AdamOp op;
  op.p = params.data;
  op.g = grads.data;
  op.m = exp_avg.data;
  op.v = exp_avg_sq.data;
  op.vmax = s.amsgrad ? max_exp_avg_sq.data : nullptr;
  op.s = s;
  launch_elementwise(op, params.numel(), all_aligned16({op.p, op.g, op.m, op.v, op.vmax}),
                     sm_count_, stream_);
}

double CudaBackend::l2_norm(const Tensor& t) {
  checks::tensor("l2_norm", "t", t, kCuda);
  constexpr int kResult = 2;  // the synchronous result's own place: no deferred slot is touched
  NormResult* result = norm_results_.data() + kResult;
  launch_l2_norm(t.data, t.numel(), all_aligned16({t.data}), norm_partials_.data(), false, 0.0f,
                 result, stream_);
  DDP_CUDA_CHECK(cudaMemcpyAsync(norm_results_host_.data() + kResult, result, sizeof(NormResult),
                                 cudaMemcpyDeviceToHost, stream_));
  // The caller decides on the norm at once.
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return norm_results_host_.data()[kResult].norm;
}

void CudaBackend::clip_grad_norm_deferred(Tensor& t, double max_norm, int slot) {
  DDP_CHECK(slot == 0 || slot == 1, "clip_grad_norm_deferred: slot " << slot << " (0 or 1)");
  checks::tensor("clip_grad_norm_deferred", "t", t, kCuda);
  const bool vec = all_aligned16({t.data});
  const bool clip = max_norm > 0;  // false for NaN too, as in the CPU backend
  NormResult* result = norm_results_.data() + slot;
  launch_l2_norm(t.data, t.numel(), vec, norm_partials_.data(), clip,
                 static_cast<float>(clip ? max_norm : 0.0), result, stream_);
  // The 16-byte copy goes before the scaling, so take_grad_norm waits for the norm and not for
  // the scaling or whatever the host queued after it.
  DDP_CUDA_CHECK(cudaMemcpyAsync(norm_results_host_.data() + slot, result, sizeof(NormResult),
                                 cudaMemcpyDeviceToHost, stream_));
  if (capturing_) {
    captured_norm_ |= 1u << slot;  // the launch records the event (after the whole graph)
  } else {
    DDP_CUDA_CHECK(cudaEventRecord(norm_copied_[slot], stream_));
    norm_pending_[slot] = true;
  }
  if (clip) launch_scale_by_device(t.data, &result->coef, t.numel(), vec, sm_count_, stream_);
}

double CudaBackend::take_grad_norm(int slot) {
  DDP_CHECK(slot == 0 || slot == 1, "take_grad_norm: slot " << slot << " (0 or 1)");
  if (norm_pending_[slot]) {
    DDP_CUDA_CHECK(cudaEventSynchronize(norm_copied_[slot]));
    norm_pending_[slot] = false;
  }
  return norm_results_host_.data()[slot].norm;
}

int64_t CudaBackend::count_nonfinite(const Tensor& t) {
  checks::tensor("count_nonfinite", "t", t, kCuda);
  DDP_CUDA_CHECK(cudaMemsetAsync(nonfinite_.data(), 0, sizeof(unsigned long long), stream_));
  launch_count_nonfinite(t.data, t.numel(), nonfinite_.data(), sm_count_, stream_);
  DDP_CUDA_CHECK(cudaMemcpyAsync(nonfinite_host_.data(), nonfinite_.data(),
                                 sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream_));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return static_cast<int64_t>(nonfinite_host_.data()[0]);
}

void CudaBackend::fill(Tensor& t, float value) {
  checks::tensor("fill", "t", t, kCuda);
  launch_elementwise(FillOp{t.data, value}, t.numel(), all_aligned16({t.data}), sm_count_, stream_);
}

void CudaBackend::scale(Tensor& t, float factor) {
  checks::tensor("scale", "t", t, kCuda);
  launch_elementwise(ScaleOp{t.data, factor}, t.numel(), all_aligned16({t.data}), sm_count_,
                     stream_);
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  checks::same_shape("copy", "src", src, "dst", dst, kCuda);
  if (src.data == dst.data || src.numel() == 0) return;
  checks::disjoint("copy", "dst", dst, "src", src);
  DDP_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data,
                                 static_cast<size_t>(src.numel()) * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::cast_to_16bit(Float16Type type, const float* in, int64_t n, uint16_t* out,
                                cudaStream_t stream) {
  DDP_CHECK(n >= 0, "cast_to_16bit: count " << n);
  launch_cast_to_16bit(type, in, n, out, sm_count_, stream);
}

void CudaBackend::cast_from_16bit(Float16Type type, const uint16_t* in, int64_t n, float* out,
                                  cudaStream_t stream) {
  DDP_CHECK(n >= 0, "cast_from_16bit: count " << n);
  launch_cast_from_16bit(type, in, n, out, sm_count_, stream);
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<cuda::CudaBackend>(device);
}

void force_gemm_plan(Backend& backend, const GemmPlan* plan) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  DDP_CHECK(cuda_backend != nullptr,
            "force_gemm_plan: backend '" << backend.name() << "' is not the CUDA backend");
  cuda_backend->force_gemm_plan(plan);
}

namespace {
cuda::CudaBackend& as_cuda(Backend& backend, const char* what) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  DDP_CHECK(cuda_backend != nullptr,
            what << ": backend '" << backend.name() << "' is not the CUDA backend");
  return *cuda_backend;
}
}  // namespace

void cast_to_16bit(Backend& backend, cuda::Float16Type type, const float* in, int64_t n,
                   uint16_t* out) {
  cuda::CudaBackend& cuda_backend = as_cuda(backend, "cast_to_16bit");
  cuda_backend.cast_to_16bit(type, in, n, out, cuda_backend.stream());
}

void cast_from_16bit(Backend& backend, cuda::Float16Type type, const uint16_t* in, int64_t n,
                     float* out) {
  cuda::CudaBackend& cuda_backend = as_cuda(backend, "cast_from_16bit");
  cuda_backend.cast_from_16bit(type, in, n, out, cuda_backend.stream());
}

namespace {
class EventMark final : public StreamMark {
 public:
  EventMark(std::shared_ptr<cuda::EventClock> clock, cudaStream_t stream)
      : clock_(std::move(clock)), event_(clock_->take()) {
    DDP_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~EventMark() override { clock_->give_back(event_); }
  double time() override {
    if (!resolved_) {
      time_ = clock_->seconds(event_);
      resolved_ = true;
    }
    return time_;
  }

 private:
  std::shared_ptr<cuda::EventClock> clock_;
  cudaEvent_t event_;
  bool resolved_ = false;
  double time_ = 0.0;
};
}  // namespace

std::shared_ptr<StreamMark> mark_stream(Backend& backend) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  DDP_CHECK(cuda_backend != nullptr,
            "mark_stream: backend '" << backend.name() << "' is not the CUDA backend");
  return std::make_shared<EventMark>(cuda_backend->clock(), cuda_backend->stream());
}

}  // namespace ddp
