// A block's sum of one double per thread in a fixed tree, for the kernels that need it (the
// gradient norm, PowerSGD's Gram-Schmidt). Compiled by nvcc and the CPU emulation.
#pragma once

#include "kernels/cuda/cuda_api.h"

namespace ddp {
namespace cuda {

/// Adds the block's per-thread sums (THREADS of them, a power of two, in `sums`: shared memory
/// of THREADS doubles) in a fixed tree and returns the total to every thread. Every thread of
/// the block calls it; the trailing barrier lets the next call reuse `sums`.
template <int THREADS>
__device__ __forceinline__ double block_sum_fixed(double mine, double* sums) {
  const int t = static_cast<int>(threadIdx.x);
  sums[t] = mine;
  __syncthreads();
  for (int width = THREADS / 2; width > 0; width >>= 1) {
    if (t < width) sums[t] += sums[t + width];
    __syncthreads();
  }
  const double total = sums[0];
  __syncthreads();
  return total;
}

}  // namespace cuda
}  // namespace ddp
