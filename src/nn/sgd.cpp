// SGD (see optim.h).
#include "nn/sgd.h"

#include "core/check.h"

namespace ddp {

Sgd::Sgd(const SgdOptions& options, size_t numel, Device device) : options_(options) {
  DDP_CHECK(options.lr > 0.0f, "optimizer.lr must be > 0");
  DDP_CHECK(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
            "optimizer.nesterov requires momentum > 0 and dampening = 0");
  if (options.momentum != 0.0f) momentum_ = Buffer(numel, device);
}

void Sgd::step(Backend& be, Tensor params, const Tensor& grads) {
  DDP_CHECK(params.numel() == grads.numel(),
            "Sgd::step: " << params.numel() << " parameters but " << grads.numel() << " gradients");
  Tensor buf = momentum_buffer();
  DDP_CHECK(options_.momentum == 0.0f || buf.numel() == params.numel(),
            "Sgd::step: momentum buffer holds " << buf.numel() << " values for " << params.numel()
                                                << " parameters");
  be.sgd_step(params, grads, buf, options_, steps_ == 0);
  ++steps_;
}

Tensor Sgd::momentum_buffer() {
  return Tensor{momentum_.data(), 1, static_cast<int64_t>(momentum_.numel()), momentum_.device()};
}

}  // namespace ddp
