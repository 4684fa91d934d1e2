// Buffer allocation: aligned host memory, or device memory through core/device_memory.h (which
// throws in a build without CUDA).
#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/check.h"
#include "core/device_memory.h"

namespace ddp {

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

Buffer::Buffer(size_t numel, Device device) : numel_(numel), device_(device) {
  if (numel == 0) return;
  if (device == Device::CUDA) {
    data_ = static_cast<float*>(cuda_malloc_bytes(numel * sizeof(float)));
    try {
      cuda_zero_bytes(data_, numel * sizeof(float));
    } catch (...) {
      cuda_free_bytes(data_);
      throw;
    }
    return;
  }
  size_t bytes = (numel * sizeof(float) + 63) / 64 * 64;
  data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
  DDP_CHECK(data_ != nullptr, "out of memory allocating " << bytes << " bytes");
  std::memset(data_, 0, bytes);
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      numel_(std::exchange(other.numel_, 0)),
      device_(other.device_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    numel_ = std::exchange(other.numel_, 0);
    device_ = other.device_;
  }
  return *this;
}

void Buffer::release() {
  if (device_ == Device::CUDA) {
    cuda_free_bytes(data_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  numel_ = 0;
}

std::string shape_string(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

std::string shape_string(int64_t rows, int64_t cols) { return shape_string({rows, cols}); }

}  // namespace ddp
