// Sequential's mixed-precision forward and backward (training.precision bf16 or fp16): every
// Linear on the backend's MixedLinear kernels. The model is Linear (ReLU Linear)*, so every
// hidden Linear ends in a ReLU (fused into its store) and every Linear but the first reads a
// ReLU's output (its input gradient leaves masked by it).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "nn/sequential.h"

namespace ddp {

/// The 16-bit operands: the input batch, each Linear's hidden output and weight copy (rounded
/// anew every forward, from the float32 master values), and two gradient buffers in turn.
struct Sequential::Mixed {
  Half format;
  Buffer input;
  std::vector<Buffer> hidden;   // per hidden Linear: its output after the ReLU [max_batch, out]
  std::vector<Buffer> weights;  // per Linear: [out, in]
  Buffer grad_a, grad_b;        // [max_batch, widest]
  Tensor16 view(Buffer& b, int64_t rows, int64_t cols) const {
    return Tensor16::of(b, rows, cols, format);
  }
};

std::shared_ptr<Sequential::Mixed> Sequential::make_mixed(const std::vector<int64_t>& widths,
                                                          int64_t max_batch, Device device,
                                                          Half format) {
  auto m = std::make_shared<Mixed>();
  m->format = format;
  const auto rows = static_cast<size_t>(max_batch);
  m->input = half_buffer(rows * static_cast<size_t>(widths.front()), device);
  size_t widest = 0;
  for (size_t j = 0; j + 1 < widths.size(); ++j) {
    const auto in = static_cast<size_t>(widths[j]), out = static_cast<size_t>(widths[j + 1]);
    if (j + 2 < widths.size()) m->hidden.push_back(half_buffer(rows * out, device));
    m->weights.push_back(half_buffer(out * in, device));
    widest = std::max({widest, in, out});
  }
  m->grad_a = half_buffer(rows * widest, device);
  m->grad_b = half_buffer(rows * widest, device);
  return m;
}

MixedLinear& Sequential::mixed_kernels(Backend& be) const {
  MixedLinear* k = be.mixed_linear(mixed_->format);
  DDP_CHECK(k != nullptr, "training.precision: the "
                              << be.name() << " backend has no "
                              << (mixed_->format == Half::Bf16 ? "bf16" : "fp16") << " GEMMs");
  return *k;
}

const Tensor& Sequential::forward_mixed(Backend& be, const Tensor& x) {
  MixedLinear& k = mixed_kernels(be);
  Mixed& m = *mixed_;
  Tensor16 in = m.view(m.input, x.rows, x.cols);
  k.round(x, in);
  const size_t linears = m.weights.size();
  for (size_t j = 0; j < linears; ++j) {
    const bool hidden = j + 1 < linears;
    const std::string name =
        observer_ ? "forward " + unit_names_[2 * j] + (hidden ? "+" + unit_names_[2 * j + 1] : "")
                  : std::string();
    observe(name, true);
    const Parameter& w = *params_[2 * j];
    const Parameter& b = *params_[2 * j + 1];
    Tensor16 w16 = m.view(m.weights[j], w.value.rows, w.value.cols);
    k.round(w.value, w16);
    if (hidden) {
      Tensor16 y = m.view(m.hidden[j], x.rows, w.value.rows);
      k.forward_relu(in, w16, b.value, y);
      in = y;
    } else {
      outputs_.back() = Tensor::of(activations_.back(), x.rows, w.value.rows);
      k.forward(in, w16, b.value, outputs_.back());
    }
    observe(name, false);
  }
  return outputs_.back();
}

void Sequential::backward_mixed(Backend& be, const Tensor& dlogits, bool accumulate,
                                const GradReadyHook& ready) {
  MixedLinear& k = mixed_kernels(be);
  Mixed& m = *mixed_;
  const int64_t rows = dlogits.rows;
  Tensor16 dy = m.view(m.grad_a, rows, dlogits.cols);
  k.round(dlogits, dy);
  Buffer* spare = &m.grad_b;
  for (size_t j = m.weights.size(); j-- > 0;) {
    const std::string name =
        observer_ ? "backward " + unit_names_[2 * j] + (j > 0 ? "+" + unit_names_[2 * j - 1] : "")
                  : std::string();
    observe(name, true);
    Parameter& w = *params_[2 * j];
    Parameter& b = *params_[2 * j + 1];
    const Tensor16 x =
        j == 0 ? m.view(m.input, rows, widths_[0]) : m.view(m.hidden[j - 1], rows, widths_[j]);
    // Parameter gradients first and announced (bias, then weight: Linear's order), so their
    // allreduce starts while the input gradient is computed.
    k.backward_params(dy, x, accumulate, w.grad, b.grad);
    const LayerReady layer_ready{&ready, first_param_[2 * j]};
    layer_ready(1);
    layer_ready(0);
    if (j > 0) {
      Tensor16 dx = m.view(*spare, rows, widths_[j]);
      k.backward_input_relu(dy, m.view(m.weights[j], w.value.rows, w.value.cols), x, dx);
      spare = spare == &m.grad_a ? &m.grad_b : &m.grad_a;
      dy = dx;
    }
    observe(name, false);
  }
}

}  // namespace ddp
