// Sequential: the MLP as an ordered list of layers, with the activation buffers of one batch
// (allocated once for the largest batch, so the steady state allocates nothing). Each Linear
// followed by a ReLU runs as one kernel each way: the ReLU in the product's store going forward,
// its mask in the input gradient's store going back (bitwise the same as separate layers).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/random.h"
#include "nn/layers.h"

namespace ddp {

class Sequential {
 public:
  /// Linear layers of the given widths (input first) with `activation` ("relu") between them;
  /// parameters are registered as layers.{i}.weight, layers.{i}.bias (i counts Linear layers).
  /// Parameters are unbound until bind() gives them storage. With `mixed`, every Linear runs
  /// on the backend's MixedLinear kernels in that 16-bit format (training.precision): the input
  /// and each forward's weight copies rounded to it, hidden outputs and the gradients between
  /// layers stored in it, the logits and the parameter gradients float32.
  Sequential(const std::vector<int64_t>& widths, const std::string& activation, int64_t max_batch,
             Device device = Device::CPU, std::optional<Half> mixed = std::nullopt);

  /// Parameters in registration order.
  const std::vector<Parameter*>& parameters() const { return params_; }
  std::vector<size_t> parameter_numels() const;
  /// Each parameter's first dimension (a weight's out features, a bias's size).
  std::vector<size_t> parameter_rows() const;
  std::vector<std::string> parameter_names() const;
  /// Each parameter's layer, in registration order (an index that grows with depth). Backward
  /// reads a layer's parameter values until it starts on the layer below: once a parameter of
  /// layer k is marked ready, the values of every layer above k may change (comm/reducer.h's
  /// fuse).
  std::vector<size_t> parameter_layers() const;
  int64_t in_features() const { return widths_.front(); }
  int64_t out_features() const { return widths_.back(); }
  std::string describe() const;

  /// Points parameter i's value at values + offsets[i] and its grad at grads + offsets[i].
  void bind(float* values, float* grads, const std::vector<size_t>& offsets);

  /// PyTorch's default nn.Linear init: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)), drawn
  /// layer by layer (weight row-major, then bias) from `rng`.
  void init_uniform(Rng& rng);

  /// Logits [rows, out] for x [rows, in] (rows <= max_batch); valid until the next forward.
  const Tensor& forward(Backend& be, const Tensor& x);

  /// Backward from dlogits [rows, out] through the last forward; calls ready(param index) for
  /// each parameter as soon as its gradient is final.
  void backward(Backend& be, const Tensor& dlogits, bool accumulate, const GradReadyHook& ready);

  /// Called before (begin = true) and after each layer's kernels are queued, forward and
  /// backward, with names like "forward layers.0+relu.0" (a Linear and the ReLU fused into it)
  /// or "backward layers.1+relu.0" (the ReLU's mask applied to the input gradient): the trace's
  /// per-layer spans. An empty observer (the default) costs nothing.
  using LayerObserver = std::function<void(const std::string& name, bool begin)>;
  void set_layer_observer(LayerObserver observer) { observer_ = std::move(observer); }

 private:
  struct Mixed;  // the 16-bit operands of mixed precision
  static std::shared_ptr<Mixed> make_mixed(const std::vector<int64_t>& widths, int64_t max_batch,
                                           Device device, Half format);
  const Tensor& forward_mixed(Backend& be, const Tensor& x);
  void backward_mixed(Backend& be, const Tensor& dlogits, bool accumulate,
                      const GradReadyHook& ready);
  MixedLinear& mixed_kernels(Backend& be) const;
  void observe(const std::string& name, bool begin) const {
    if (observer_) observer_(name, begin);
  }

  std::vector<int64_t> widths_;
  int64_t max_batch_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Parameter*> params_;
  std::vector<size_t> first_param_;  // per layer: index of its first parameter
  std::vector<bool> relu_follows_;   // per layer: a Linear whose output goes straight into a ReLU
  std::vector<Buffer> activations_;  // per layer output [max_batch, width]; none for a Linear
                                     // whose ReLU is fused (it would hold pre-activations)
  Buffer grad_a_, grad_b_;           // ping-pong activation gradients
  LayerObserver observer_;
  std::vector<std::string> unit_names_;  // per layer: "layers.k" or "relu.k" (after Linear k)
  Tensor input_;                         // the last forward's input
  std::vector<Tensor> outputs_;          // the last forward's outputs
  std::shared_ptr<Mixed> mixed_;         // null: float32 throughout
};

}  // namespace ddp
