// torch.optim.SGD over the flat parameter arena (Backend::sgd_step): momentum, dampening,
// weight decay, Nesterov.
#pragma once

#include <cstddef>
#include <vector>

#include "nn/optimizer.h"

namespace ddp {

class Sgd : public Optimizer {
 public:
  /// Updates `spans` of the parameter arena. Keeps a "momentum" state array when
  /// options.momentum != 0.
  Sgd(const SgdOptions& options, std::vector<Span> spans, Device device);

  const SgdOptions& options() const { return options_; }

 private:
  /// params -= lr · update(grads), torch.optim.SGD semantics (see Backend::sgd_step).
  void update(Backend& be, Tensor& params, const Tensor& grads, size_t state_offset,
              double lr) override;

  SgdOptions options_;
};

}  // namespace ddp
