// Shared pieces of the CUDA kernel tests (real device and CPU emulation): tags, device tensors
// with guard zones around the view, and the accuracy check every float result goes through
// (finite, norm-wise relative error, element-wise error against the condition of each element).
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

// Every CUDA test carries these tags; the emulated run adds [emu] so either can be selected.
#if defined(DDP_CUDA_EMULATION)
#define DDP_CUDA_TAGS "[cuda][emu]"
#else
#define DDP_CUDA_TAGS "[cuda]"
#endif

namespace ddp_cuda_test {

using ddp::Tensor;

// Emulation runs every thread on the CPU under sanitizers: shapes there stay small.
#if defined(DDP_CUDA_EMULATION)
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

constexpr double kTol = 1e-5;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
// Written around every view; a kernel that stores past its view's ends changes it.
constexpr float kGuardValue = -7777.25f;
// Floats of guard zone on each side: 4 keeps a view of a fresh buffer 16-byte aligned.
constexpr int64_t kGuard = 4;

inline std::vector<float> random_floats(size_t n, uint64_t seed, double lo = -1.0,
                                        double hi = 1.0) {
  ddp::Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

inline std::vector<int32_t> random_labels(int64_t n, int64_t classes, uint64_t seed) {
  ddp::Rng rng(seed);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (auto& l : labels) l = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  return labels;
}

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

/// The accuracy check of every float kernel result: each value finite,
/// ||got - ref|| <= tol * ||ref|| and |got_i - ref_i| <= tol * cond_i + tiny for every i, where
/// cond_i is the sum of the magnitudes of the terms that make element i (a dot product's
/// sum of |a_k * b_k|, plus |bias| or |initial value|). cond_i = 0 demands ref_i exactly.
inline void require_accurate(const std::vector<float>& got, const std::vector<double>& ref,
                             const std::vector<double>& cond, const std::string& what,
                             double tol = kTol) {
  INFO(what);
  REQUIRE(got.size() == ref.size());
  REQUIRE(cond.size() == ref.size());
  constexpr double kTiny = 1e-30;
  double diff2 = 0.0, ref2 = 0.0;
  int64_t bad = -1;
  std::string reason;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    const double err = std::fabs(g - r);
    diff2 += (g - r) * (g - r);
    ref2 += r * r;
    if (bad < 0 && !std::isfinite(g)) {
      bad = static_cast<int64_t>(i);
      reason = "not finite";
    } else if (bad < 0 && !(err <= tol * cond[i] + kTiny)) {
      bad = static_cast<int64_t>(i);
      reason = "error above tol * cond";
    }
  }
  if (bad >= 0) {
    const size_t i = static_cast<size_t>(bad);
    std::ostringstream oss;
    oss << std::setprecision(10) << "element " << i << " (" << reason << "): got " << got[i]
        << ", reference " << ref[i] << ", cond " << cond[i];
    FAIL(oss.str());
  }
  const double diff_norm = std::sqrt(diff2), ref_norm = std::sqrt(ref2);
  INFO("norm-wise: ||got - ref|| = " << diff_norm << ", ||ref|| = " << ref_norm);
  REQUIRE(diff_norm <= tol * ref_norm + kTiny);
}

/// The same check against another float result (the CPU backend's), same conditions.
inline void require_accurate(const std::vector<float>& got, const std::vector<float>& ref,
                             const std::vector<double>& cond, const std::string& what,
                             double tol = kTol) {
  require_accurate(got, std::vector<double>(ref.begin(), ref.end()), cond, what, tol);
}

/// Bitwise equality (NaN payloads included), reporting the first difference.
inline void require_bitwise_equal(const std::vector<float>& got, const std::vector<float>& want,
                                  const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], sizeof a);
    std::memcpy(&b, &want[i], sizeof b);
    if (a != b) {
      std::ostringstream oss;
      oss << std::setprecision(10) << "element " << i << ": got " << got[i] << " (0x" << std::hex
          << a << "), want " << std::dec << want[i] << " (0x" << std::hex << b << ")";
      FAIL(oss.str());
    }
  }
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
