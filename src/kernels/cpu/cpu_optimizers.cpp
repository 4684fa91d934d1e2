// The optimizer steps of the CPU backend, element for element as torch's CPU kernels compute
// them. Every torch `a.add(b, alpha=s)` and `a.addcmul(b, c, value=s)` is one fused
// multiply-add in ATen's vectorised CPU kernels (vec::fmadd, and the compiler's contraction of
// `a + s * b * c`), so it is std::fma here; every other product and sum is rounded on its own.
// This file is compiled with -ffp-contract=off (CMakeLists.txt), so the compiler fuses nothing
// behind our back: what is written is what is computed.
#include "kernels/cpu/cpu_optimizers.h"

#include <cmath>
#include <cstdint>

namespace ddp {
namespace cpu {

// torch.optim.SGD. buf.mul_(momentum) is a plain multiply. Scalars are rounded to float as
// torch does (1 - dampening is formed in double first, as in Python).
void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdOptions& opt,
              bool first_step) {
  const bool use_momentum = opt.momentum != 0.0f;
  const float lr = opt.lr, wd = opt.weight_decay, momentum = opt.momentum;
  const float keep = static_cast<float>(1.0 - static_cast<double>(opt.dampening));
  float* p = params.data;
  const float* grad = grads.data;
  float* buf = momentum_buf.data;
  const int64_t n = params.numel();
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i];
    if (wd != 0.0f) g = std::fma(p[i], wd, g);
    if (use_momentum) {
      buf[i] = first_step ? g : std::fma(g, keep, buf[i] * momentum);
      g = opt.nesterov ? std::fma(buf[i], momentum, g) : buf[i];
    }
    p[i] = std::fma(g, -lr, p[i]);
  }
}

namespace {

// torch.maximum: NaN when either is NaN.
inline float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

// torch 1.13's _single_tensor_adam / _single_tensor_adamw for one element:
//   adamw: param.mul_(1 - lr * wd)            adam: grad = grad.add(param, alpha=wd)
//   exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   amsgrad: torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
//   denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
//   param.addcdiv_(exp_avg, denom, value=-step_size)        (param + (value * exp_avg) / denom)
// The options are template arguments so that each combination is one branch-free loop the
// compiler vectorises (IEEE sqrt and division are correctly rounded in every lane: the same bits).
template <bool kDecoupled, bool kL2, bool kAmsgrad>
inline void adam_element(const AdamStep& s, float& p, float grad, float& m, float& v, float* vmax) {
  if (kDecoupled) p = p * s.decay;
  if (kL2) grad = std::fma(p, s.weight_decay, grad);
  m = std::fma(grad, s.one_minus_beta1, m * s.beta1);
  v = std::fma(s.one_minus_beta2 * grad, grad, v * s.beta2);
  float second = v;
  if (kAmsgrad) second = *vmax = nan_max(*vmax, v);
  const float denom = std::sqrt(second) / s.bias_correction2_sqrt + s.eps;
  p = p + (s.neg_step_size * m) / denom;
}

template <bool kDecoupled, bool kL2, bool kAmsgrad>
void adam_loop(const AdamStep& s, float* p, const float* g, float* m, float* v, float* vmax,
               int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    adam_element<kDecoupled, kL2, kAmsgrad>(s, p[i], g[i], m[i], v[i],
                                            kAmsgrad ? vmax + i : nullptr);
}

}  // namespace

void adam_step(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
               Tensor& max_exp_avg_sq, const AdamStep& s) {
  float* p = params.data;
  const float* g = grads.data;
  float* m = exp_avg.data;
  float* v = exp_avg_sq.data;
  float* vmax = s.amsgrad ? max_exp_avg_sq.data : nullptr;
  const int64_t n = params.numel();
  const bool l2 = !s.decoupled && s.weight_decay != 0.0f;
  if (s.decoupled) {
    s.amsgrad ? adam_loop<true, false, true>(s, p, g, m, v, vmax, n)
              : adam_loop<true, false, false>(s, p, g, m, v, vmax, n);
  } else if (l2) {
    s.amsgrad ? adam_loop<false, true, true>(s, p, g, m, v, vmax, n)
              : adam_loop<false, true, false>(s, p, g, m, v, vmax, n);
  } else {
    s.amsgrad ? adam_loop<false, false, true>(s, p, g, m, v, vmax, n)
              : adam_loop<false, false, false>(s, p, g, m, v, vmax, n);
  }
}

double l2_norm(const Tensor& t) {
  constexpr int64_t kLanes = 8;
  double lane[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  const float* x = t.data;
  const int64_t n = t.numel(), whole = n - n % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const double v = x[i + l];
      lane[l] += v * v;
    }
  }
  for (int64_t i = whole; i < n; ++i) {
    const double v = x[i];
    lane[i - whole] += v * v;
  }
  const double sum =
      ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  return std::sqrt(sum);
}

}  // namespace cpu
}  // namespace ddp
