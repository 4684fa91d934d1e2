// SGD over the flat parameter arena: one fused kernel call per step, the same on every rank,
// so replicas that start identical and see identical averaged gradients stay identical.
#pragma once

#include <cstddef>

#include "kernels/backend.h"

namespace ddp {

class Sgd {
 public:
  /// numel: size of the flat parameter/gradient arenas the steps will see.
  Sgd(const SgdOptions& options, size_t numel, Device device);

  /// params -= lr · update(grads), torch.optim.SGD semantics (see Backend::sgd_step).
  void step(Backend& be, Tensor params, const Tensor& grads);

  const SgdOptions& options() const { return options_; }
  /// The momentum buffer (empty when momentum == 0), for checkpoints.
  Tensor momentum_buffer();
  long steps_taken() const { return steps_; }
  /// Continues from a checkpoint that had taken `steps` updates (> 0: the next update uses
  /// the momentum buffer, which the caller restores through momentum_buffer()).
  void set_steps_taken(long steps) { steps_ = steps; }

 private:
  SgdOptions options_;
  Buffer momentum_;
  long steps_ = 0;
};

}  // namespace ddp
