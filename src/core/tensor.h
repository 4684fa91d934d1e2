// Memory and views. A Buffer owns float storage on one device and cannot be copied (a copy of
// a gradient arena is always a performance accident); a Tensor is a non-owning row-major 2-D
// view {data, rows, cols} into some Buffer, the only thing kernels take.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

enum class Device { CPU, CUDA };

const char* device_name(Device d);

/// Owning float storage on the CPU (64-byte aligned) or a CUDA device (256-byte aligned, needs
/// a CUDA build). Move-only. Zero-initialised.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t numel, Device device = Device::CPU);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t numel() const { return numel_; }
  size_t bytes() const { return numel_ * sizeof(float); }
  Device device() const { return device_; }

 private:
  void release();
  float* data_ = nullptr;
  size_t numel_ = 0;
  Device device_ = Device::CPU;
};

/// Non-owning row-major view of rows x cols floats. A vector of n elements is a 1 x n view.
struct Tensor {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  Device device = Device::CPU;

  int64_t numel() const { return rows * cols; }
  /// The first `n` rows of this view (a batch smaller than the allocated maximum).
  Tensor first_rows(int64_t n) const { return Tensor{data, n, cols, device}; }
  static Tensor of(Buffer& b, int64_t rows, int64_t cols, size_t offset = 0) {
    return Tensor{b.data() + offset, rows, cols, b.device()};
  }
};

/// The two 16-bit float formats (bit patterns and rounding: core/float16.h).
enum class Half { Bf16, Fp16 };

/// Non-owning row-major view of rows x cols 16-bit floats (uint16_t bit patterns) in a Buffer's
/// storage: the GEMM operands of mixed precision (training.precision), never master values.
struct Tensor16 {
  uint16_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  Device device = Device::CPU;
  Half format = Half::Bf16;

  int64_t numel() const { return rows * cols; }
  Tensor16 first_rows(int64_t n) const { return Tensor16{data, n, cols, device, format}; }
  /// A view of the first rows x cols halves of b (made by half_buffer).
  static Tensor16 of(Buffer& b, int64_t rows, int64_t cols, Half format) {
    return Tensor16{reinterpret_cast<uint16_t*>(b.data()), rows, cols, b.device(), format};
  }
};

/// Storage for n 16-bit values (a Buffer counts floats: two halves each).
inline Buffer half_buffer(size_t n, Device device) { return Buffer((n + 1) / 2, device); }

/// A range [offset, offset + numel) of a flat arena (a bucket, or one rank's part of one).
struct Span {
  size_t offset = 0;
  size_t numel = 0;
  size_t end() const { return offset + numel; }
  bool operator==(const Span& o) const { return offset == o.offset && numel == o.numel; }
};

/// "[784, 256]": the one way shapes are written in messages and logs.
std::string shape_string(const std::vector<int64_t>& dims);
std::string shape_string(int64_t rows, int64_t cols);

}  // namespace ddp
