// The CUDA entry points of a build without the CUDA toolkit: queries answer "not built" and
// everything that needs a device throws ddp::Error saying how to get one.
#if !defined(DDP_WITH_CUDA)

#include <cstring>

#include "core/check.h"
#include "kernels/cuda/cuda.h"

namespace ddp {

namespace {
[[noreturn]] void not_built(const char* what) {
  DDP_THROW(what << ": this build has no CUDA support (configure with the CUDA toolkit installed, "
                    "-DDDP_CUDA=ON)");
}
}  // namespace

bool cuda_built() { return false; }

int cuda_device_count(std::string* why_none) {
  if (why_none != nullptr) *why_none = "built without CUDA";
  return 0;
}

CudaDeviceInfo cuda_device_info(int) { not_built("cuda_device_info"); }
void cuda_set_device(int) { not_built("cuda_set_device"); }
void* cuda_malloc_bytes(size_t) { not_built("device memory"); }
void cuda_free_bytes(void*) noexcept {}
void* cuda_malloc_pinned_bytes(size_t) { not_built("pinned memory"); }
void cuda_free_pinned_bytes(void*) noexcept {}
int64_t cuda_allocation_count() { return 0; }
void cuda_copy_bytes(void*, const void*, size_t) { not_built("cuda_copy_bytes"); }
void cuda_zero_bytes(void*, size_t) { not_built("cuda_zero_bytes"); }

void copy_tensor(const Tensor& src, Tensor& dst) {
  DDP_CHECK(src.device == Device::CPU && dst.device == Device::CPU,
            "copy_tensor: a cuda tensor in a build without CUDA");
  DDP_CHECK(src.rows == dst.rows && src.cols == dst.cols,
            "copy_tensor: shapes differ: src " << shape_string(src.rows, src.cols) << ", dst "
                                               << shape_string(dst.rows, dst.cols));
  if (src.numel() > 0)
    std::memcpy(dst.data, src.data, static_cast<size_t>(src.numel()) * sizeof(float));
}

std::unique_ptr<Backend> make_cuda_backend(int) { not_built("make_cuda_backend"); }
void force_gemm_plan(Backend&, const GemmPlan*) { not_built("force_gemm_plan"); }
std::shared_ptr<StreamMark> mark_stream(Backend&) { not_built("mark_stream"); }
void cast_to_16bit(Backend&, cuda::Float16Type, const float*, int64_t, uint16_t*) {
  not_built("cast_to_16bit");
}
void cast_from_16bit(Backend&, cuda::Float16Type, const uint16_t*, int64_t, float*) {
  not_built("cast_from_16bit");
}

struct BatchUploader::Impl {};
BatchUploader::BatchUploader(Backend&, int64_t, int64_t) { not_built("BatchUploader"); }
BatchUploader::~BatchUploader() = default;
void BatchUploader::upload(const float*, const int32_t*, int64_t) { not_built("BatchUploader"); }
BatchUploader::DeviceBatch BatchUploader::acquire() { not_built("BatchUploader"); }

}  // namespace ddp

#endif  // !DDP_WITH_CUDA
