// torch.optim.Adam / AdamW (see adam.h).
#include "nn/adam.h"

#include <cmath>
#include <utility>

#include "core/check.h"

namespace ddp {

Adam::Adam(const AdamOptions& options, std::vector<Span> spans, Device device)
    : Optimizer(std::move(spans)), options_(options) {
  const double beta1 = options.betas[0], beta2 = options.betas[1];
  DDP_CHECK(beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0,
            "optimizer.betas must be in [0, 1), got [" << beta1 << ", " << beta2 << "]");
  DDP_CHECK(options.eps >= 0.0, "optimizer.eps must be >= 0, got " << options.eps);
  add_state("exp_avg", device);
  add_state("exp_avg_sq", device);
  if (options.amsgrad) add_state("max_exp_avg_sq", device);
}

// torch 1.13 _single_tensor_adam(w), capturable=False: step = state_steps[i].item() (a float),
// bias_correction1 = 1 - beta1 ** step, bias_correction2 = 1 - beta2 ** step,
// step_size = lr / bias_correction1, bias_correction2_sqrt = math.sqrt(bias_correction2); the
// tensor ops then round each Python float to float32.
AdamStep Adam::scalars(long step, double lr) const {
  const double beta1 = options_.betas[0], beta2 = options_.betas[1];
  const double t = static_cast<double>(static_cast<float>(step));
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  AdamStep s;
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  s.eps = static_cast<float>(options_.eps);
  s.decoupled = options_.decoupled;
  s.amsgrad = options_.amsgrad;
  if (options_.decoupled) {
    s.decay = static_cast<float>(1.0 - lr * options_.weight_decay);
  } else {
    s.weight_decay = static_cast<float>(options_.weight_decay);
  }
  return s;
}

void Adam::update(Backend& be, Tensor& params, const Tensor& grads, size_t state_offset,
                  double lr) {
  const int64_t n = params.numel();
  Tensor exp_avg = state_view(0, state_offset, n), exp_avg_sq = state_view(1, state_offset, n);
  Tensor max_exp_avg_sq = options_.amsgrad ? state_view(2, state_offset, n) : Tensor{};
  be.adam_step(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, scalars(steps_taken() + 1, lr));
}

}  // namespace ddp
