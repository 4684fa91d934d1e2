// torch.optim.SGD (see sgd.h).
#include "nn/sgd.h"

#include "core/check.h"

namespace ddp {

Sgd::Sgd(const SgdOptions& options, size_t numel, Device device) : options_(options) {
  DDP_CHECK(options.lr > 0.0f, "optimizer.lr must be > 0");
  DDP_CHECK(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
            "optimizer.nesterov requires momentum > 0 and dampening = 0");
  if (options.momentum != 0.0f) add_state("momentum", numel, device);
}

void Sgd::step(Backend& be, Tensor params, const Tensor& grads, double lr) {
  DDP_CHECK(params.numel() == grads.numel(),
            "Sgd::step: " << params.numel() << " parameters but " << grads.numel() << " gradients");
  Tensor buf = options_.momentum != 0.0f ? state_at(0) : Tensor{};
  DDP_CHECK(options_.momentum == 0.0f || buf.numel() == params.numel(),
            "Sgd::step: momentum buffer holds " << buf.numel() << " values for " << params.numel()
                                                << " parameters");
  SgdOptions opt = options_;
  opt.lr = static_cast<float>(lr);
  be.sgd_step(params, grads, buf, opt, steps_ == 0);
  ++steps_;
}

}  // namespace ddp
