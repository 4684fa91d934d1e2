// The kernel interface every device implements: exactly the operations one training step of an
// MLP needs. Kernels take Tensor views and never allocate; shapes are checked by the caller
// (nn/) and asserted cheaply here. The CPU backend (src/kernels/cpu/) maps our buffers with Eigen.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace ddp {

/// Result of softmax cross-entropy over a batch.
struct XentResult {
  double loss_sum = 0.0;  ///< sum over rows of -log softmax(logits)[label]
  int64_t correct = 0;    ///< rows whose argmax (first maximum) equals the label
};

/// torch.optim.SGD's hyper-parameters, same meaning.
struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

/// The scalars of one torch.optim.Adam or AdamW step, formed on the host in double as torch
/// forms them in Python, each rounded to float once (nn/adam.cpp makes them).
struct AdamStep {
  float beta1 = 0.9f, one_minus_beta1 = 0.1f;
  float beta2 = 0.999f, one_minus_beta2 = 0.001f;
  float bias_correction2_sqrt = 1.0f;  ///< sqrt(1 - beta2^step)
  float neg_step_size = 0.0f;          ///< -lr / (1 - beta1^step)
  float eps = 1e-8f;
  float weight_decay = 0.0f;  ///< Adam: the L2 term added to the gradient; ignored by AdamW
  float decay = 1.0f;         ///< AdamW: the parameters' factor 1 - lr·weight_decay
  bool decoupled = false;     ///< AdamW (decay) rather than Adam (weight_decay)
  bool amsgrad = false;
};

/// The Linear kernels of mixed precision (training.precision bf16 or fp16): operands in one
/// 16-bit format, products accumulated in float32 with a float32 bias; the roundings
/// torch.autocast makes for nn.Linear, except that the weight gradient stays float32. A layer's
/// output is rounded to the format once (after the bias and ReLU); the logits stay float32.
class MixedLinear {
 public:
  virtual ~MixedLinear() = default;
  /// What runs the products, for the startup log ("oneDNN (avx512_core_bf16)"), and when it is
  /// slower than float32, why.
  virtual std::string describe() const = 0;
  /// y = x rounded to the format (to nearest, ties to even): the input batch, the weights'
  /// operand copies, the loss's gradient.
  virtual void round(const Tensor& x, Tensor16& y) = 0;
  /// y[b,out] = max(x·wᵀ + bias, 0), rounded: a hidden layer's output (w is [out,in]).
  virtual void forward_relu(const Tensor16& x, const Tensor16& w, const Tensor& bias,
                            Tensor16& y) = 0;
  /// y[b,out] = x·wᵀ + bias in float32: the logits.
  virtual void forward(const Tensor16& x, const Tensor16& w, const Tensor& bias, Tensor& y) = 0;
  /// dx[b,in] = dy·w where relu_output > 0, else 0, rounded: the gradient before the ReLU whose
  /// output fed this layer.
  virtual void backward_input_relu(const Tensor16& dy, const Tensor16& w,
                                   const Tensor16& relu_output, Tensor16& dx) = 0;
  /// dw[out,in] = dyᵀ·x and db[1,out] = column sums of dy, in float32; added to dw/db with
  /// accumulate.
  virtual void backward_params(const Tensor16& dy, const Tensor16& x, bool accumulate, Tensor& dw,
                               Tensor& db) = 0;
};

/// Work a backend captured instead of running it (a CUDA graph), replayed by
/// Backend::launch_graph.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;

  /// y[b,out] = x[b,in] · wᵀ + bias[out] (w is [out,in] like nn.Linear); if fuse_relu,
  /// y = max(y, 0). bias is a 1 x out view.
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool fuse_relu,
                              Tensor& y) = 0;

  /// dx[b,in] = dy[b,out] · w. If relu_output is given (the [b,in] output of the ReLU that fed
  /// this layer), dx is multiplied by (relu_output > 0): the ReLU backward, fused.
  virtual void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor* relu_output,
                                     Tensor& dx) = 0;

  /// dw[out,in] = dyᵀ · x and db[1,out] = column sums of dy. With accumulate the results are
  /// added to dw/db (gradient accumulation); otherwise dw/db are overwritten.
  virtual void linear_backward_params(const Tensor& dy, const Tensor& x, bool accumulate,
                                      Tensor& dw, Tensor& db) = 0;

  /// y = max(x, 0). In place (y == x) is allowed.
  virtual void relu_forward(const Tensor& x, Tensor& y) = 0;

  /// dx = dy * (y > 0), where y is the ReLU's output. In place (dx == dy) is allowed.
  virtual void relu_backward(const Tensor& dy, const Tensor& y, Tensor& dx) = 0;

  /// Numerically stable softmax cross-entropy of logits[b,c] against labels[b] (each in [0,c)).
  /// If dlogits is given it receives (softmax - onehot) * grad_scale; the caller passes
  /// grad_scale = 1 / (samples the loss is a mean over).
  virtual XentResult softmax_xent(const Tensor& logits, const int32_t* labels, float grad_scale,
                                  Tensor* dlogits) = 0;

  /// One torch.optim.SGD step over flat arrays of equal size, elementwise:
  ///   g = grad + wd·p; if momentum: buf = first_step ? g : momentum·buf + (1-dampening)·g,
  ///   g = nesterov ? g + momentum·buf : buf;  p -= lr·g.
  /// momentum_buf is only touched when momentum != 0.
  virtual void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf,
                        const SgdOptions& opt, bool first_step) = 0;

  /// One torch.optim.Adam (or AdamW, when s.decoupled) step over flat arrays of equal size, in
  /// torch 1.13's operation order, elementwise:
  ///   AdamW: p = p·decay.  Adam: g = grad + weight_decay·p (fused).
  ///   m = beta1·m + (1-beta1)·g (fused);  v = beta2·v + ((1-beta2)·g)·g (fused);
  ///   amsgrad: vmax = max(vmax, v), used for v;  p = p + (neg_step_size·m) / (sqrt(v)/bc2 + eps).
  /// max_exp_avg_sq is only touched with amsgrad. Every backend gives bitwise the same result.
  virtual void adam_step(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
                         Tensor& max_exp_avg_sq, const AdamStep& s) = 0;

  /// softmax_xent without making the host wait for the result: the batch's loss and correct
  /// count are added to totals slot `slot` (0 or 1), read later by take_xent_totals(slot), so
  /// the host can queue the next step while the device still computes this one. The CPU
  /// backend computes at once (a bad label throws here); the CUDA backend reports it at take.
  virtual void softmax_xent_deferred(const Tensor& logits, const int32_t* labels, float grad_scale,
                                     Tensor* dlogits, int slot);
  /// The totals added to `slot` since it was last taken; clears the slot. Waits only for the
  /// work that produced them. Throws ddp::Error if a label was outside [0, classes).
  virtual XentResult take_xent_totals(int slot);

  /// The L2 norm of t: its squares summed in double, in an order fixed by t's size alone (the
  /// same value on every run). Waits for the work that produced t.
  virtual double l2_norm(const Tensor& t) = 0;

  /// torch.nn.utils.clip_grad_norm_ over the flat gradients t, without making the host wait:
  /// the norm of t (as l2_norm), then with max_norm > 0, t *= clip_coefficient(norm, max_norm)
  /// when that is below 1. The norm goes to slot `slot` (0 or 1), read by take_grad_norm(slot).
  /// Backends that compute at once use this form; the CUDA backend keeps it on the device.
  virtual void clip_grad_norm_deferred(Tensor& t, double max_norm, int slot);
  /// The norm clip_grad_norm_deferred put in `slot`; waits only for the work that produced it.
  virtual double take_grad_norm(int slot);

  /// How many values of t are NaN or ±Inf. Waits for the work that produced t (the caller
  /// decides on it at once: skip the step or stop).
  virtual int64_t count_nonfinite(const Tensor& t) = 0;

  virtual void fill(Tensor& t, float value) = 0;
  virtual void scale(Tensor& t, float factor) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;

  /// Waits until all work queued by this backend is complete (no-op on the CPU).
  virtual void synchronize() {}

  /// Whether this backend can capture the work it queues and replay it with one call (the CUDA
  /// backend: CUDA graphs). The others refuse the three calls below.
  virtual bool captures_graphs() const { return false; }
  /// Starts capturing on the calling thread: what is queued from now on (kernels, copies, the
  /// collectives of communicators whose streams join this backend's) is recorded, not run.
  /// Deferred results (softmax_xent_deferred, clip_grad_norm_deferred) queued in a capture
  /// become readable through their slots once a launch of the graph has been queued.
  virtual void begin_graph();
  /// Ends the capture and returns the graph, ready to launch. After a failure inside a capture,
  /// end_graph(/*discard=*/true) ends it, keeps nothing and returns null.
  virtual std::unique_ptr<DeviceGraph> end_graph(bool discard = false);
  /// Queues a replay of `graph`. False, with nothing queued, when it no longer fits: scratch
  /// memory it uses was reallocated since its capture, or a deferred slot it fills is not in
  /// the state it was captured in. The caller then captures anew.
  virtual bool launch_graph(DeviceGraph& graph);

  /// The mixed-precision Linear kernels in `format`, or null where this backend has none.
  virtual MixedLinear* mixed_linear(Half format) {
    (void)format;
    return nullptr;
  }

 private:
  XentResult xent_slots_[2];  // the deferred totals of backends that compute at once
  double norm_slots_[2] = {0.0, 0.0};
};

/// clip_grad_norm_'s factor, in torch's float32 arithmetic: total_norm is a float32 tensor and
/// `max_norm / (total_norm + 1e-6)` is reciprocal(total_norm + 1e-6) * max_norm (clamped to 1
/// by the caller). Every backend forms it exactly so.
inline float clip_coefficient(double norm, double max_norm) {
  const float shifted = static_cast<float>(norm) + 1e-6f;
  const float reciprocal = 1.0f / shifted;
  return reciprocal * static_cast<float>(max_norm);
}

/// The Eigen CPU backend (single-threaded per rank: one rank per core is the parallelism).
std::unique_ptr<Backend> make_cpu_backend();

/// Flush denormal floats to zero (FTZ) and read denormal inputs as zero (DAZ) on the calling
/// thread, where the CPU supports it (x86 SSE). Denormals appear as weights and gradients decay
/// and cost ~100x per operation on x86; the values they stand for (< 1.2e-38) do not matter to
/// training. Deterministic either way. Returns whether the mode is supported.
bool set_flush_denormals(bool on);

}  // namespace ddp
