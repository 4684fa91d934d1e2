// torch.optim.SGD over the flat parameter arena (Backend::sgd_step): momentum, dampening,
// weight decay, Nesterov.
#pragma once

#include <cstddef>

#include "nn/optimizer.h"

namespace ddp {

class Sgd : public Optimizer {
 public:
  /// numel: size of the flat parameter/gradient arenas the steps will see. Keeps a "momentum"
  /// state array when options.momentum != 0.
  Sgd(const SgdOptions& options, size_t numel, Device device);

  /// params -= lr · update(grads), torch.optim.SGD semantics (see Backend::sgd_step).
  void step(Backend& be, Tensor params, const Tensor& grads, double lr) override;

  const SgdOptions& options() const { return options_; }

 private:
  SgdOptions options_;
};

}  // namespace ddp
