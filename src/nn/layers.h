// Parameters and layers of the MLP. A Parameter's value and grad are views into flat arenas
// owned elsewhere (the gradient arena is the Reducer's buckets: backward writes straight into
// them). Layers know their math; Sequential owns activations and the order of things.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"

namespace ddp {

struct Parameter {
  std::string name;            ///< e.g. "layers.0.weight" (the safetensors name)
  std::vector<int64_t> shape;  ///< [out, in] for weights, [out] for biases
  Tensor value;                ///< view into the parameter arena (2-D: rows x cols)
  Tensor grad;                 ///< view into the gradient arena, same shape as value
  int64_t numel() const;
};

/// Called by backward with the index (within the model's parameter list) of each parameter
/// the moment its gradient is final.
using GradReadyHook = std::function<void(size_t param_index)>;

/// What a layer calls for its parameters: ready(k) announces the layer's k-th parameter as the
/// model's first + k, with no hook of its own in between.
struct LayerReady {
  const GradReadyHook* hook;
  size_t first;
  void operator()(size_t k) const { (*hook)(first + k); }
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string describe() const = 0;
  virtual int64_t out_features() const = 0;
  virtual std::vector<Parameter*> parameters() { return {}; }

  /// y = f(x); x and y stay alive (owned by Sequential) until backward.
  virtual void forward(Backend& be, const Tensor& x, Tensor& y) = 0;

  /// Given dy: writes parameter gradients (added to the existing ones when accumulate), calls
  /// ready(i) for each of this layer's parameters as soon as its gradient is final (i counts
  /// this layer's parameters(); LayerReady makes it the model's index), then writes dx unless
  /// dx is null (the first layer).
  virtual void backward(Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                        bool accumulate, LayerReady ready) = 0;
};

/// nn.Linear: y = x·Wᵀ + b, W [out, in].
class Linear : public Layer {
 public:
  Linear(int64_t in, int64_t out, const std::string& prefix);
  std::string describe() const override;
  int64_t out_features() const override { return out_; }
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  void forward(Backend& be, const Tensor& x, Tensor& y) override;
  void backward(Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                bool accumulate, LayerReady ready) override;
  int64_t in_features() const { return in_; }

  /// forward() followed by a ReLU, fused into the product's store: y = max(x·Wᵀ + b, 0).
  void forward_relu(Backend& be, const Tensor& x, Tensor& y);
  /// backward() where x is the output of a ReLU: dx leaves already multiplied by (x > 0), so it
  /// is the gradient before that ReLU (the ReLU's backward fused into the product's store).
  void backward_through_relu(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx,
                             bool accumulate, LayerReady ready);

 private:
  void parameter_gradients(Backend& be, const Tensor& x, const Tensor& dy, bool accumulate,
                           LayerReady ready);
  int64_t in_, out_;
  Parameter weight_, bias_;
};

class ReLU : public Layer {
 public:
  explicit ReLU(int64_t features) : features_(features) {}
  std::string describe() const override { return "ReLU()"; }
  int64_t out_features() const override { return features_; }
  void forward(Backend& be, const Tensor& x, Tensor& y) override;
  void backward(Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                bool accumulate, LayerReady ready) override;

 private:
  int64_t features_;
};

}  // namespace ddp
