// The CPU backend's mixed-precision Linear kernels (kernels/backend.h's MixedLinear) in bf16.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace ddp::cpu {

/// bf16 operands, float32 accumulation: oneDNN's matmul where the build has oneDNN and the CPU
/// has AVX512-BF16 or AMX; else Eigen's float32 GEMMs over the operands widened back to float32
/// (the same roundings, slower than fp32; describe() says why).
std::unique_ptr<MixedLinear> make_bf16_linear();

/// The same kernels with Eigen's GEMMs whatever the build (what a build without oneDNN runs):
/// the tests hold both engines to one reference.
std::unique_ptr<MixedLinear> make_bf16_linear_on_eigen();

}  // namespace ddp::cpu
