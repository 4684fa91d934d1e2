// Sequential MLP: construction from widths, binding to flat storage, init, forward, backward.
#include "nn/sequential.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/check.h"

namespace ddp {

Sequential::Sequential(const std::vector<int64_t>& widths, const std::string& activation,
                       int64_t max_batch, Device device, std::optional<Half> mixed)
    : widths_(widths), max_batch_(max_batch) {
  DDP_CHECK(widths.size() >= 2,
            "model.layers: need at least 2 widths (input and output), got " << widths.size());
  DDP_CHECK(activation == "relu",
            "model.activation: unsupported activation '" << activation << "'");
  DDP_CHECK(max_batch > 0, "Sequential: max_batch must be positive");
  int64_t widest = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    auto linear = std::make_unique<Linear>(widths[i], widths[i + 1], "layers." + std::to_string(i));
    first_param_.push_back(params_.size());
    for (Parameter* p : linear->parameters()) params_.push_back(p);
    layers_.push_back(std::move(linear));
    if (i + 2 < widths.size()) {
      first_param_.push_back(params_.size());
      layers_.push_back(std::make_unique<ReLU>(widths[i + 1]));
    }
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    const bool fused = dynamic_cast<Linear*>(layers_[i].get()) != nullptr &&
                       i + 1 < layers_.size() &&
                       dynamic_cast<ReLU*>(layers_[i + 1].get()) != nullptr;
    relu_follows_.push_back(fused);
    activations_.push_back(
        fused ? Buffer()
              : Buffer(static_cast<size_t>(max_batch * layers_[i]->out_features()), device));
    outputs_.push_back(Tensor{});
  }
  for (size_t i = 0, linear = 0; i < layers_.size(); ++i) {
    const bool is_linear = dynamic_cast<Linear*>(layers_[i].get()) != nullptr;
    unit_names_.push_back(is_linear ? "layers." + std::to_string(linear++)
                                    : "relu." + std::to_string(linear - 1));
  }
  for (int64_t w : widths) widest = std::max(widest, w);
  if (mixed) {
    // Float32 activations only for the logits; the rest lives in 16 bits.
    for (size_t i = 0; i + 1 < activations_.size(); ++i) activations_[i] = Buffer();
    mixed_ = make_mixed(widths, max_batch, device, *mixed);
    return;
  }
  grad_a_ = Buffer(static_cast<size_t>(max_batch * widest), device);
  grad_b_ = Buffer(static_cast<size_t>(max_batch * widest), device);
}

std::vector<size_t> Sequential::parameter_numels() const {
  std::vector<size_t> n;
  for (const Parameter* p : params_) n.push_back(static_cast<size_t>(p->numel()));
  return n;
}

std::vector<size_t> Sequential::parameter_rows() const {
  std::vector<size_t> n;
  for (const Parameter* p : params_) n.push_back(static_cast<size_t>(p->shape.front()));
  return n;
}

std::vector<std::string> Sequential::parameter_names() const {
  std::vector<std::string> n;
  for (const Parameter* p : params_) n.push_back(p->name);
  return n;
}

std::vector<size_t> Sequential::parameter_layers() const {
  std::vector<size_t> layer(params_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const size_t end = i + 1 < layers_.size() ? first_param_[i + 1] : params_.size();
    for (size_t p = first_param_[i]; p < end; ++p) layer[p] = i;
  }
  return layer;
}

std::string Sequential::describe() const {
  std::ostringstream oss;
  oss << "Sequential(";
  for (size_t i = 0; i < layers_.size(); ++i) oss << (i ? ", " : "") << layers_[i]->describe();
  oss << ")";
  return oss.str();
}

void Sequential::bind(float* values, float* grads, const std::vector<size_t>& offsets) {
  DDP_CHECK(
      offsets.size() == params_.size(),
      "Sequential::bind: " << offsets.size() << " offsets for " << params_.size() << " parameters");
  const Device device = activations_.back().device();
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const int64_t rows = p.shape.size() == 2 ? p.shape[0] : 1;
    const int64_t cols = p.shape.back();
    p.value = Tensor{values + offsets[i], rows, cols, device};
    p.grad = Tensor{grads + offsets[i], rows, cols, device};
  }
}

void Sequential::init_uniform(Rng& rng) {
  for (size_t i = 0; i < params_.size(); i += 2) {
    Parameter& w = *params_[i];
    Parameter& b = *params_[i + 1];
    DDP_CHECK(w.value.data != nullptr && w.value.device == Device::CPU,
              "init_uniform: parameters must be bound to CPU storage");
    const double bound = 1.0 / std::sqrt(static_cast<double>(w.shape[1]));
    for (int64_t k = 0; k < w.numel(); ++k)
      w.value.data[k] = static_cast<float>(rng.uniform(-bound, bound));
    for (int64_t k = 0; k < b.numel(); ++k)
      b.value.data[k] = static_cast<float>(rng.uniform(-bound, bound));
  }
}

const Tensor& Sequential::forward(Backend& be, const Tensor& x) {
  DDP_CHECK(x.cols == in_features() && x.rows >= 1 && x.rows <= max_batch_,
            "Sequential::forward: input " << shape_string(x.rows, x.cols)
                                          << " does not fit a model of " << in_features()
                                          << " inputs and batch <= " << max_batch_);
  input_ = x;
  if (mixed_) return forward_mixed(be, x);
  const Tensor* in = &input_;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string name =
        observer_ ? "forward " + unit_names_[i] + (relu_follows_[i] ? "+" + unit_names_[i + 1] : "")
                  : std::string();
    if (observer_) observer_(name, true);
    if (relu_follows_[i]) {
      // Linear i and ReLU i+1 in one kernel, straight into the ReLU's output.
      outputs_[i + 1] = Tensor::of(activations_[i + 1], x.rows, layers_[i + 1]->out_features());
      static_cast<Linear&>(*layers_[i]).forward_relu(be, *in, outputs_[i + 1]);
      outputs_[i] = outputs_[i + 1];
      in = &outputs_[++i];
    } else {
      outputs_[i] = Tensor::of(activations_[i], x.rows, layers_[i]->out_features());
      layers_[i]->forward(be, *in, outputs_[i]);
      in = &outputs_[i];
    }
    if (observer_) observer_(name, false);
  }
  return outputs_.back();
}

void Sequential::backward(Backend& be, const Tensor& dlogits, bool accumulate,
                          const GradReadyHook& ready) {
  const int64_t rows = input_.rows;
  DDP_CHECK(dlogits.rows == rows && dlogits.cols == out_features(),
            "Sequential::backward: dlogits " << shape_string(dlogits.rows, dlogits.cols)
                                             << " does not match the last forward's output "
                                             << shape_string(rows, out_features()));
  if (mixed_) return backward_mixed(be, dlogits, accumulate, ready);
  Tensor dy = dlogits;
  Buffer* spare = &grad_a_;
  for (size_t i = layers_.size(); i-- > 0;) {
    const Tensor& x = i == 0 ? input_ : outputs_[i - 1];
    const LayerReady layer_ready{&ready, first_param_[i]};
    const bool through_relu =
        i >= 2 && relu_follows_[i - 2] && dynamic_cast<Linear*>(layers_[i].get()) != nullptr;
    const std::string name =
        observer_ ? "backward " + unit_names_[i] + (through_relu ? "+" + unit_names_[i - 1] : "")
                  : std::string();
    if (observer_) observer_(name, true);
    if (i == 0) {
      layers_[i]->backward(be, x, outputs_[i], dy, nullptr, accumulate, layer_ready);
    } else if (through_relu) {
      // Linear i reads the output of ReLU i-1: its input gradient leaves masked, which is that
      // ReLU's backward done too.
      Tensor dx = Tensor::of(*spare, rows, x.cols);
      static_cast<Linear&>(*layers_[i])
          .backward_through_relu(be, x, dy, dx, accumulate, layer_ready);
      spare = (spare == &grad_a_) ? &grad_b_ : &grad_a_;
      dy = dx;
    } else {
      // ReLU works in place; a Linear writes dx into whichever scratch buffer dy is not in.
      Tensor dx =
          dynamic_cast<ReLU*>(layers_[i].get()) != nullptr ? dy : Tensor::of(*spare, rows, x.cols);
      layers_[i]->backward(be, x, outputs_[i], dy, &dx, accumulate, layer_ready);
      if (dx.data != dy.data) spare = (spare == &grad_a_) ? &grad_b_ : &grad_a_;
      dy = dx;
    }
    if (observer_) observer_(name, false);
    if (i == 0) break;
    if (through_relu) --i;  // skip ReLU i-1
  }
}

}  // namespace ddp
