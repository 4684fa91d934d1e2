// Device discovery and memory for the CUDA build: every device and pinned allocation of the
// library goes through here (so they can be counted: a steady-state step must allocate
// nothing), and synchronous host <-> device copies for setup, tests and results.
#include <atomic>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_api.h"

namespace ddp {

namespace {
std::atomic<int64_t> g_allocations{0};

// FP32 lanes per multiprocessor by compute capability (CUDA C++ Programming Guide, arithmetic
// instruction throughput table): 64 on 7.x and 8.0 (A100), 128 on 8.6+, 9.0
// (H100/H200), 10.x, 12.x.
int fp32_lanes_per_sm(int major, int minor) {
  if (major < 8 || (major == 8 && minor == 0)) return 64;
  return 128;
}
}  // namespace

bool cuda_built() { return true; }

int cuda_device_count(std::string* why_none) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: "no device" is an answer here, not a failure
    if (why_none != nullptr)
      *why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(rc) + ": " +
                  cudaGetErrorString(rc);
    return 0;
  }
  if (count == 0 && why_none != nullptr) *why_none = "no CUDA device is visible";
  return count;
}

CudaDeviceInfo cuda_device_info(int device) {
  cudaDeviceProp prop{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int clock_khz = 0, memory_clock_khz = 0, bus_bits = 0;
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&memory_clock_khz, cudaDevAttrMemoryClockRate, device));
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  CudaDeviceInfo info;
  info.name = prop.name;
  info.ordinal = device;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.memory_bytes = prop.totalGlobalMem;
  // Double data rate: two transfers per memory clock over the whole bus.
  info.memory_bandwidth_gbs = 2.0 * memory_clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  info.fp32_peak_gflops =
      2.0 * fp32_lanes_per_sm(prop.major, prop.minor) * prop.multiProcessorCount * clock_khz / 1e6;
  return info;
}

void cuda_set_device(int device) {
  int count = 0;
  DDP_CUDA_CHECK(cudaGetDeviceCount(&count));
  DDP_CHECK(device >= 0 && device < count,
            "CUDA device " << device << " does not exist (" << count << " visible)");
  DDP_CUDA_CHECK(cudaSetDevice(device));
}

void* cuda_malloc_bytes(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t rc = cudaMalloc(&ptr, bytes);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    DDP_THROW("cudaMalloc of " << bytes << " bytes failed: " << cudaGetErrorName(rc) << ": "
                               << cudaGetErrorString(rc));
  }
  g_allocations.fetch_add(1);
  return ptr;
}

void cuda_free_bytes(void* ptr) noexcept {
  if (ptr != nullptr) (void)cudaFree(ptr);
}

void* cuda_malloc_pinned_bytes(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t rc = cudaMallocHost(&ptr, bytes);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    DDP_THROW("cudaMallocHost of " << bytes << " bytes failed: " << cudaGetErrorName(rc) << ": "
                                   << cudaGetErrorString(rc));
  }
  g_allocations.fetch_add(1);
  return ptr;
}

void cuda_free_pinned_bytes(void* ptr) noexcept {
  if (ptr != nullptr) (void)cudaFreeHost(ptr);
}

int64_t cuda_allocation_count() { return g_allocations.load(); }

// Copies and zeroing go through the legacy default stream and wait for it. Our streams are
// created blocking, so the default stream is ordered after every kernel queued before: a copy
// of a result needs no explicit synchronize() first.
void cuda_copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, 0));
  DDP_CUDA_CHECK(cudaStreamSynchronize(0));
}

void cuda_zero_bytes(void* dst, size_t bytes) {
  if (bytes == 0) return;
  DDP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, 0));
  DDP_CUDA_CHECK(cudaStreamSynchronize(0));
}

void copy_tensor(const Tensor& src, Tensor& dst) {
  DDP_CHECK(src.rows == dst.rows && src.cols == dst.cols,
            "copy_tensor: shapes differ: src " << shape_string(src.rows, src.cols) << ", dst "
                                               << shape_string(dst.rows, dst.cols));
  const size_t bytes = static_cast<size_t>(src.numel()) * sizeof(float);
  if (src.device == Device::CPU && dst.device == Device::CPU) {
    if (bytes > 0) std::memcpy(dst.data, src.data, bytes);
    return;
  }
  cuda_copy_bytes(dst.data, src.data, bytes);
}

}  // namespace ddp
