// The CPU backend's optimizer steps (cpu_optimizers.cpp): elementwise loops over the flat
// parameter arena whose every rounding is written out, so that they match torch's CPU kernels
// and the CUDA backend's bit for bit.
#pragma once

#include "core/tensor.h"
#include "kernels/backend.h"

namespace ddp {
namespace cpu {

/// Backend::sgd_step, arguments checked by the caller.
void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdOptions& opt,
              bool first_step);

/// Backend::adam_step, arguments checked by the caller.
void adam_step(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
               Tensor& max_exp_avg_sq, const AdamStep& s);

/// Backend::l2_norm: squares summed in double over 8 interleaved lanes (element i to lane i % 8),
/// the lanes added in a fixed tree, so the loop vectorises and the order is fixed by the size.
double l2_norm(const Tensor& t);

}  // namespace cpu
}  // namespace ddp
