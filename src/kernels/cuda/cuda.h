// The CUDA side of the library as the rest of it sees it: whether CUDA is built and usable,
// device memory (move-only RAII arrays, pinned host arrays), the CUDA backend and the
// double-buffered batch upload. Everything here compiles without the CUDA toolkit; in such a
// build the queries say "not built" and everything that needs a device throws ddp::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "core/check.h"
#include "core/device_memory.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernel_args.h"

namespace ddp {

/// Number of CUDA devices this process can use; 0 when CUDA is not built, no driver is
/// installed or no device is visible, and then *why_none (if given) says which.
int cuda_device_count(std::string* why_none = nullptr);

/// What the benchmarks and the startup line print about a device.
struct CudaDeviceInfo {
  std::string name;
  int ordinal = 0;
  int compute_major = 0, compute_minor = 0;
  int sm_count = 0;
  size_t memory_bytes = 0;
  double memory_bandwidth_gbs = 0;  ///< theoretical peak from bus width and memory clock
  double fp32_peak_gflops = 0;      ///< 2 FLOP per FMA x FP32 lanes per SM x SMs x clock
};
CudaDeviceInfo cuda_device_info(int device);

/// Makes `device` current for the calling thread (every CUDA call in this process goes to it).
void cuda_set_device(int device);

/// Pinned-host allocation (device allocation: cuda_malloc_bytes, core/device_memory.h): the
/// only places memory is taken, so they are counted. Allocation failures throw ddp::Error
/// naming the size; free functions never throw.
void* cuda_malloc_pinned_bytes(size_t bytes);
void cuda_free_pinned_bytes(void* ptr) noexcept;
/// Device (or pinned) allocations made by this process so far: a steady-state training step
/// must not change it.
int64_t cuda_allocation_count();

/// Synchronous copy between host and device memory (any direction; unified addressing), like
/// cuda_zero_bytes ordered after all work already queued on the library's streams (which are
/// blocking streams), so results need no explicit synchronize() first.
void cuda_copy_bytes(void* dst, const void* src, size_t bytes);

/// Where a CudaArray lives: device memory, or page-locked host memory (what asynchronous
/// copies need).
enum class CudaMemory { kDevice, kPinned };

/// A move-only array of T in device or pinned host memory (uninitialised). Copying is deleted
/// on purpose: a copy of a device array is always a performance accident.
template <typename T, CudaMemory kWhere>
class CudaArray {
 public:
  CudaArray() = default;
  explicit CudaArray(size_t n)
      : data_(n ? static_cast<T*>(allocate(n * sizeof(T))) : nullptr), size_(n) {}
  ~CudaArray() { release(data_); }
  CudaArray(CudaArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  CudaArray& operator=(CudaArray&& o) noexcept {
    if (this != &o) {
      release(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  CudaArray(const CudaArray&) = delete;
  CudaArray& operator=(const CudaArray&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  /// Synchronous copy of n elements from the host into the front of the array.
  void upload(const T* host, size_t n) { cuda_copy_bytes(data_, host, checked(n) * sizeof(T)); }
  void download(T* host, size_t n) const { cuda_copy_bytes(host, data_, checked(n) * sizeof(T)); }

 private:
  static void* allocate(size_t bytes) {
    return kWhere == CudaMemory::kDevice ? cuda_malloc_bytes(bytes)
                                         : cuda_malloc_pinned_bytes(bytes);
  }
  static void release(T* p) noexcept {
    if (kWhere == CudaMemory::kDevice) {
      cuda_free_bytes(p);
    } else {
      cuda_free_pinned_bytes(p);
    }
  }
  size_t checked(size_t n) const {
    DDP_CHECK(n <= size_, "CudaArray: copy of " << n << " elements with an array of " << size_);
    return n;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

template <typename T>
using DeviceArray = CudaArray<T, CudaMemory::kDevice>;
template <typename T>
using PinnedArray = CudaArray<T, CudaMemory::kPinned>;

/// Copies a float tensor between host and device (either may be either; shapes must match).
void copy_tensor(const Tensor& src, Tensor& dst);

/// The CUDA backend on `device`: our own kernels (no cuBLAS), all queued on one compute stream
/// the backend owns; results are ready after synchronize() or any call that returns a value
/// to the host (softmax_xent). Kernels are deterministic: no floating-point atomics.
std::unique_ptr<Backend> make_cuda_backend(int device);

/// How the CUDA backend computes a GEMM: tile shape and how many slices K is split into
/// (slices are summed in a fixed order, so a split result is still deterministic).
struct GemmPlan {
  int tile = 0;             ///< 0: 128x128 tiles, 1: 64x64, 2: 32x32
  int splits = 1;           ///< K slices
  bool vectorized = false;  ///< 16-byte loads and stores (aligned, leading dims % 4 == 0)
};
/// The plan the backend uses for an M x N x K product on a device with `sm_count`
/// multiprocessors (pure: the same shape and device give the same plan): the largest tile with
/// at least sm_count blocks; else 32x32 tiles and the fewest K slices (each >= 256 long, at
/// most 16; `splits` is the count launch_gemm really makes) with tiles x slices >= sm_count,
/// or the most slices where none reach it. `vectorizable` says whether every operand allows
/// 16-byte access.
GemmPlan plan_gemm(int64_t m, int64_t n, int64_t k, int sm_count, bool vectorizable);

/// For tests and benchmarks: make every GEMM of `backend` (a CUDA backend) use `plan` instead
/// of plan_gemm's choice (vectorized is still forced off where operands do not allow it);
/// nullptr restores the automatic choice.
void force_gemm_plan(Backend& backend, const GemmPlan* plan);

/// Gradient compression's casts, queued on `cuda_backend`'s compute stream: out[i] = in[i]
/// rounded to `type` (core/float16.h), and back, exactly, for i in [0, n). For code without the
/// CUDA headers; the communicators use CudaBackend's forms, which take their own stream.
void cast_to_16bit(Backend& cuda_backend, cuda::Float16Type type, const float* in, int64_t n,
                   uint16_t* out);
void cast_from_16bit(Backend& cuda_backend, cuda::Float16Type type, const uint16_t* in, int64_t n,
                     float* out);

/// A point in a CUDA backend's compute stream: recording it does not make the host wait;
/// time() waits until the device got there and says when, on the seconds_now() clock. For the
/// overlap statistics and the trace.
class StreamMark {
 public:
  virtual ~StreamMark() = default;
  virtual double time() = 0;
};
/// Records a mark on `cuda_backend`'s compute stream now.
std::shared_ptr<StreamMark> mark_stream(Backend& cuda_backend);

/// Batches to the device, double-buffered: upload() copies a batch into one of two pinned
/// staging slots and starts its transfer on a copy stream, so the next batch travels while the
/// backend computes on this one; acquire() hands the oldest uploaded batch to the backend's
/// compute stream (a stream wait, no host synchronisation). A slot is reused only after the
/// compute work queued on its batch is done (a stream wait again). The loop it is made for:
///   up.upload(batch 0);
///   for each step i: b = up.acquire(); if (more) up.upload(batch i + 1); train on b;
class BatchUploader {
 public:
  BatchUploader(Backend& cuda_backend, int64_t max_rows, int64_t features);
  ~BatchUploader();
  BatchUploader(const BatchUploader&) = delete;
  BatchUploader& operator=(const BatchUploader&) = delete;

  /// Starts the upload of x [rows, features] (row-major) and labels [rows] into the next slot.
  /// Refused (ddp::Error) when that slot still holds a batch not yet acquired or the batch
  /// acquired last (acquire the next batch first).
  void upload(const float* x, const int32_t* labels, int64_t rows);

  struct DeviceBatch {
    Tensor x;                         ///< [rows, features] on the device
    const int32_t* labels = nullptr;  ///< [rows] on the device
  };
  /// The oldest uploaded batch, for work queued on the backend until the next acquire()
  /// (which releases it: its slot can then take a new upload).
  DeviceBatch acquire();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
