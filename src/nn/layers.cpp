// Linear and ReLU layers over the Backend kernels.
#include "nn/layers.h"

#include "core/check.h"

namespace ddp {

int64_t Parameter::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Linear::Linear(int64_t in, int64_t out, const std::string& prefix) : in_(in), out_(out) {
  DDP_CHECK(in > 0 && out > 0, "Linear(" << in << ", " << out << "): sizes must be positive");
  weight_.name = prefix + ".weight";
  weight_.shape = {out, in};
  bias_.name = prefix + ".bias";
  bias_.shape = {out};
}

std::string Linear::describe() const {
  return "Linear(in_features=" + std::to_string(in_) + ", out_features=" + std::to_string(out_) +
         ")";
}

void Linear::forward(Backend& be, const Tensor& x, Tensor& y) {
  be.linear_forward(x, weight_.value, bias_.value, false, y);
}

void Linear::forward_relu(Backend& be, const Tensor& x, Tensor& y) {
  be.linear_forward(x, weight_.value, bias_.value, true, y);
}

void Linear::parameter_gradients(Backend& be, const Tensor& x, const Tensor& dy, bool accumulate,
                                 LayerReady ready) {
  // Parameter gradients first and announce them, so their allreduce can start while dx and
  // the layers below are still being computed.
  be.linear_backward_params(dy, x, accumulate, weight_.grad, bias_.grad);
  ready(1);  // bias: registered after the weight, so it is earlier in ready order
  ready(0);
}

void Linear::backward(Backend& be, const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                      bool accumulate, LayerReady ready) {
  parameter_gradients(be, x, dy, accumulate, ready);
  if (dx != nullptr) be.linear_backward_input(dy, weight_.value, nullptr, *dx);
}

void Linear::backward_through_relu(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx,
                                   bool accumulate, LayerReady ready) {
  parameter_gradients(be, x, dy, accumulate, ready);
  be.linear_backward_input(dy, weight_.value, &x, dx);
}

void ReLU::forward(Backend& be, const Tensor& x, Tensor& y) { be.relu_forward(x, y); }

void ReLU::backward(Backend& be, const Tensor&, const Tensor& y, const Tensor& dy, Tensor* dx, bool,
                    LayerReady) {
  if (dx != nullptr) be.relu_backward(dy, y, *dx);
}

}  // namespace ddp
