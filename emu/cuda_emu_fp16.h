// The subset of cuda_bf16.h and cuda_fp16.h the kernels use, for the CPU emulation: the two
// 16-bit storage types (bit patterns, trivially copyable, 2 bytes like CUDA's) and the
// conversions with float, rounding to nearest even as the _rn intrinsics do. A NaN stays a NaN
// (quiet, sign kept); fp16 overflows to infinity from 65520 up and underflows through its
// subnormals. No arithmetic operators: the kernels compute in float.
#pragma once

#if defined(__CUDACC__)
#error "cuda_emu_fp16.h is for host compilers; nvcc must use <cuda_bf16.h> and <cuda_fp16.h>"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

struct alignas(2) __nv_bfloat16 {
  unsigned short __x;
};
struct alignas(2) __half {
  unsigned short __x;
};

namespace ddp_emu {
namespace detail {
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail
}  // namespace ddp_emu

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const uint32_t x = ::ddp_emu::detail::bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return {static_cast<unsigned short>((x >> 16) | 0x40u)};
  // The 16 dropped bits rounded to nearest, ties to the even kept bit; a carry moves on into
  // the exponent (to infinity past the largest finite value).
  return {static_cast<unsigned short>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

inline float __bfloat162float(__nv_bfloat16 h) {
  return ::ddp_emu::detail::float_of(static_cast<uint32_t>(h.__x) << 16);
}

inline __half __float2half_rn(float f) {
  const uint32_t x = ::ddp_emu::detail::bits_of(f);
  const auto sign = static_cast<unsigned short>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return {static_cast<unsigned short>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
  if (a >= 0x477ff000u) return {static_cast<unsigned short>(sign | 0x7c00u)};  // 65520 and up
  if (a < 0x38800000u) {
    // Below 2^-14: a multiple of 2^-24, rounded by the host's nearest-even mode (the scaling by
    // a power of two is exact); 1024 units is the smallest normal, whose encoding it also is.
    const float units = std::nearbyint(::ddp_emu::detail::float_of(a) * 16777216.0f);
    return {static_cast<unsigned short>(sign | static_cast<uint32_t>(units))};
  }
  // Rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  return {
      static_cast<unsigned short>(sign | ((a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13))};
}

inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.__x & 0x8000u) << 16;
  const uint32_t exponent = (h.__x >> 10) & 0x1fu;
  const uint32_t fraction = h.__x & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(fraction), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return ::ddp_emu::detail::float_of(sign | 0x7f800000u | fraction << 13);
  return ::ddp_emu::detail::float_of(sign | (exponent + 112u) << 23 | fraction << 13);
}
