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

}  // namespace cpu
}  // namespace ddp
