// torch.optim.Adam and torch.optim.AdamW over the flat parameter arena (Backend::adam_step):
// betas, eps, weight decay (L2 in the gradient for Adam, decoupled for AdamW), AMSGrad, and
// the bias correction of torch 1.13 / 2.x (the step count as a float, powers in double).
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "nn/optimizer.h"

namespace ddp {

struct AdamOptions {
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool decoupled = false;  ///< AdamW
};

class Adam : public Optimizer {
 public:
  /// Keeps "exp_avg" and "exp_avg_sq" (and "max_exp_avg_sq" with amsgrad), zeroed.
  Adam(const AdamOptions& options, std::vector<Span> spans, Device device);

  /// The kernel's scalars for update number `step` (1 for the first) at learning rate `lr`,
  /// formed in double as torch's Python code forms them, each rounded to float once.
  AdamStep scalars(long step, double lr) const;

 private:
  void update(Backend& be, Tensor& params, const Tensor& grads, size_t state_offset,
              double lr) override;

  AdamOptions options_;
};

}  // namespace ddp
