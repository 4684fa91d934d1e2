// Shared pieces of the CUDA tests (real device and CPU emulation): tags, device tensors with
// guard zones around the view, forced GEMM plans; the references and the accuracy check every
// float result goes through come from kernel_references.h, shared with the CPU backend's tests.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"
#include "kernel_references.h"

// Every CUDA test carries these tags; the emulated run adds [emu] so either can be selected.
#if defined(DDP_CUDA_EMULATION)
#define DDP_CUDA_TAGS "[cuda][emu]"
#else
#define DDP_CUDA_TAGS "[cuda]"
#endif

namespace ddp_cuda_test {

using ddp::Tensor;
// The references, comparisons and test data every backend's kernel tests share.
using ddp_kernel_test::kNaN;
using ddp_kernel_test::kTol;
using ddp_kernel_test::random_floats;
using ddp_kernel_test::random_labels;
using ddp_kernel_test::require_accurate;
using ddp_kernel_test::require_bitwise_equal;

// Emulation runs every thread on the CPU under sanitizers: shapes there stay small.
#if defined(DDP_CUDA_EMULATION)
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

using ddp_kernel_test::kGuard;
using ddp_kernel_test::kGuardValue;

inline Tensor host_view(std::vector<float>& v, int64_t rows, int64_t cols) {
  REQUIRE(static_cast<int64_t>(v.size()) == rows * cols);
  return Tensor{v.data(), rows, cols, ddp::Device::CPU};
}
/// For kernel inputs: Tensor has no const form, and the kernels only read their inputs.
inline Tensor host_view(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return host_view(const_cast<std::vector<float>&>(v), rows, cols);
}

/// A rows x cols view into device memory with `front` guard floats before it and kGuard after
/// (front = kGuard keeps it 16-byte aligned, front = 1 makes it unaligned). The guards hold
/// kGuardValue; guards_intact() says whether they still do.
class DeviceTensor {
 public:
  DeviceTensor(int64_t rows, int64_t cols, int64_t front = kGuard)
      : buffer_(static_cast<size_t>(rows * cols + front + kGuard), ddp::Device::CUDA),
        rows_(rows),
        cols_(cols),
        front_(front) {
    const std::vector<float> guards(buffer_.numel(), kGuardValue);
    ddp::cuda_copy_bytes(buffer_.data(), guards.data(), buffer_.bytes());
    view_ = Tensor{buffer_.data() + front_, rows_, cols_, ddp::Device::CUDA};
  }
  DeviceTensor(const std::vector<float>& values, int64_t rows, int64_t cols, int64_t front = kGuard)
      : DeviceTensor(rows, cols, front) {
    upload(values);
  }

  Tensor& view() { return view_; }
  const Tensor& view() const { return view_; }
  int64_t numel() const { return rows_ * cols_; }

  void upload(const std::vector<float>& values) {
    REQUIRE(static_cast<int64_t>(values.size()) == numel());
    ddp::cuda_copy_bytes(view_.data, values.data(), values.size() * sizeof(float));
  }
  std::vector<float> download() const {
    std::vector<float> out(static_cast<size_t>(numel()));
    ddp::cuda_copy_bytes(out.data(), view_.data, out.size() * sizeof(float));
    return out;
  }
  /// -1 when both guard zones are untouched, else the offset (relative to the view's first
  /// element) of the first changed guard float.
  int64_t first_damaged_guard() const {
    std::vector<float> all(buffer_.numel());
    ddp::cuda_copy_bytes(all.data(), buffer_.data(), buffer_.bytes());
    for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) {
      const bool guard = i < front_ || i >= front_ + numel();
      if (guard && !(all[static_cast<size_t>(i)] == kGuardValue)) return i - front_;
    }
    return -1;
  }

 private:
  ddp::Buffer buffer_;
  int64_t rows_, cols_, front_;
  Tensor view_;
};

inline void require_guards_intact(const DeviceTensor& t, const std::string& what) {
  INFO(what << ": a store outside the view changed the guard at offset "
            << t.first_damaged_guard());
  REQUIRE(t.first_damaged_guard() == -1);
}

/// Runs f and requires a ddp::Error whose message contains `part`.
template <typename F>
void require_error(F&& f, const std::string& part) {
  try {
    f();
  } catch (const ddp::Error& e) {
    CHECK_THAT(e.message(), Catch::Contains(part));
    return;
  }
  FAIL("no ddp::Error was thrown; expected one containing \"" << part << "\"");
}

/// Restores the automatic GEMM plan when a test that forced one ends (or fails).
class ForcedGemmPlan {
 public:
  ForcedGemmPlan(ddp::Backend& backend, const ddp::GemmPlan& plan) : backend_(backend) {
    ddp::force_gemm_plan(backend_, &plan);
  }
  ~ForcedGemmPlan() { ddp::force_gemm_plan(backend_, nullptr); }
  ForcedGemmPlan(const ForcedGemmPlan&) = delete;
  ForcedGemmPlan& operator=(const ForcedGemmPlan&) = delete;

 private:
  ddp::Backend& backend_;
};

}  // namespace ddp_cuda_test
