// Device memory as the core layer sees it: whether the build has CUDA, and the raw allocation
// Buffer takes device memory with. Declared here, defined by the CUDA backend
// (src/kernels/cuda/memory.cu; in a build without CUDA, src/kernels/stub/cuda_stub.cpp, whose
// allocation throws ddp::Error), so that core/ never includes the kernels above it.
#pragma once

#include <cstddef>

namespace ddp {

/// Whether this build contains the CUDA backend.
bool cuda_built();

/// Raw device allocation: the only place device memory is taken, so it is counted
/// (cuda_allocation_count, kernels/cuda/cuda.h). Failures throw ddp::Error naming the size;
/// freeing never throws.
void* cuda_malloc_bytes(size_t bytes);
void cuda_free_bytes(void* ptr) noexcept;
/// Zeroes device memory, ordered after the work queued on the library's streams.
void cuda_zero_bytes(void* dst, size_t bytes);

}  // namespace ddp
