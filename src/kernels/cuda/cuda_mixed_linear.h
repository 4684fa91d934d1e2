// The CUDA backend's mixed-precision Linear kernels (kernels/backend.h's MixedLinear) in bf16
// or fp16: WMMA GEMMs with the layer's epilogue fused (gemm16.cuh), the roundings of
// float16_casts.cuh. Made and owned by CudaBackend, which refuses bf16 below sm_80 first.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace ddp {
namespace cuda {

class CudaBackend;

/// The kernels in `format`, queued on `backend`'s compute stream (which must outlive them).
/// Every tensor must be in device memory and in `format`.
std::unique_ptr<MixedLinear> make_mixed_linear(Half format, CudaBackend& backend);

}  // namespace cuda
}  // namespace ddp
