// The door to CUDA's warp matrix functions (nvcuda::wmma) and 16-bit types for our kernels: the
// real headers under nvcc, the emulation's subset (emu/cuda_emu_wmma.h) when DDP_CUDA_EMULATION
// is defined. Only the mixed-precision GEMM (gemm16.cuh) includes it.
#pragma once

#include "kernels/cuda/cuda_api.h"

#if defined(DDP_CUDA_EMULATION)
#include "cuda_emu_wmma.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif
