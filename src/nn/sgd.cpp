// torch.optim.SGD (see sgd.h).
#include "nn/sgd.h"

#include <utility>

#include "core/check.h"

namespace ddp {

Sgd::Sgd(const SgdOptions& options, std::vector<Span> spans, Device device)
    : Optimizer(std::move(spans)), options_(options) {
  DDP_CHECK(options.lr > 0.0f, "optimizer.lr must be > 0");
  DDP_CHECK(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
            "optimizer.nesterov requires momentum > 0 and dampening = 0");
  if (options.momentum != 0.0f) add_state("momentum", device);
}

void Sgd::update(Backend& be, Tensor& params, const Tensor& grads, size_t state_offset, double lr) {
  Tensor buf = options_.momentum != 0.0f ? state_view(0, state_offset, params.numel()) : Tensor{};
  SgdOptions opt = options_;
  opt.lr = static_cast<float>(lr);
  be.sgd_step(params, grads, buf, opt, steps_taken() == 0);
}

}  // namespace ddp
