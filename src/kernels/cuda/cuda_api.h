// The one door to CUDA for our sources: the real runtime under nvcc, or the test-only CPU
// emulation (emu/cuda_emu.h) when DDP_CUDA_EMULATION is defined, so the same kernel bodies
// and launch code run in CI without a GPU. Also the check macro and the launch helper that
// every CUDA call and kernel launch goes through.
#pragma once

#if defined(DDP_CUDA_EMULATION)
#include "cuda_emu.h"
#else
#include <cuda_runtime.h>
#endif

#include <utility>

#include "core/check.h"

#if defined(__CUDACC__)
#define DDP_UNROLL _Pragma("unroll")
#else
#define DDP_UNROLL
#endif

// DDP_EMU_SHARED(name); after each __shared__ array: the emulation poisons it before every block
// so that reading what the block did not write shows; nothing on a device.
#if !defined(DDP_CUDA_EMULATION)
#define DDP_EMU_SHARED(name) static_assert(sizeof(name) > 0, "a shared array")
#endif

/// DDP_CUDA_CHECK(cudaMemcpyAsync(...)): throws ddp::Error naming the call, CUDA's error name
/// and text, file:line and rank.
#define DDP_CUDA_CHECK(call)                                                   \
  do {                                                                         \
    cudaError_t ddp_cuda_rc_ = (call);                                         \
    if (ddp_cuda_rc_ != cudaSuccess)                                           \
      DDP_THROW(#call << " failed: " << cudaGetErrorName(ddp_cuda_rc_) << ": " \
                      << cudaGetErrorString(ddp_cuda_rc_));                    \
  } while (0)

/// DDP_LAUNCH(kernel, grid, block, stream, args...): launches and checks cudaGetLastError()
/// (bad configurations and earlier asynchronous faults surface here, at the right line). A
/// template kernel with commas in its name goes through a pointer: auto* k = &f<A, B>;
#define DDP_LAUNCH(kernel, grid, block, stream, ...)                      \
  do {                                                                    \
    ::ddp::cuda::launch_kernel(kernel, grid, block, stream, __VA_ARGS__); \
    DDP_CUDA_CHECK(cudaGetLastError());                                   \
  } while (0)

namespace ddp {
namespace cuda {

template <typename... KernelArgs, typename... Args>
void launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, cudaStream_t stream,
                   Args&&... args) {
#if defined(DDP_CUDA_EMULATION)
  ::ddp_emu::launch(kernel, grid, block, stream, std::forward<Args>(args)...);
#elif defined(__CUDACC__)
  // clang-format off
  kernel<<<grid, block, 0, stream>>>(std::forward<Args>(args)...);
  // clang-format on
#else
  // A host compiler may include this header (tests reach the backend's stream through it), but
  // only nvcc can launch.
  static_assert(sizeof(kernel) == 0, "kernel launches compile with nvcc");
#endif
}

/// Ceiling division for grid sizes.
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The most blocks a grid has along x (along y and z: 65535).
constexpr int64_t kMaxGridX = 2147483647;

}  // namespace cuda
}  // namespace ddp
