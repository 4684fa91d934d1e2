// The two 16-bit float formats of distributed.compression, as bit patterns (uint16_t), with
// IEEE round-to-nearest-even from float32, for host and device code alike (the CUDA kernels
// include it; nothing here needs cuda_fp16.h or a compiler's half type).
//   bf16: bfloat16, float32's sign and 8-bit exponent with 7 stored fraction bits.
//   fp16: IEEE binary16, 5-bit exponent, 10 fraction bits, largest finite 65504.
// Rounding: a finite float32 goes to the nearest value of the type, ties to the even one;
// fp16 overflows to infinity from 65520 up (the tie at the top rounds to even, which is
// infinity), and gradually underflows through its subnormals. Infinities stay infinities; a NaN
// stays a NaN (quiet, sign kept). Decoding is exact. The sum of two 16-bit values is their
// float32 sum rounded once more: float32 holds every such sum exactly unless the exponents
// differ so much that the smaller is far below half a unit of the larger, so this is the
// correctly rounded 16-bit sum, what a native 16-bit addition gives.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DDP_HOST_DEVICE __host__ __device__
#else
#define DDP_HOST_DEVICE
#endif

namespace ddp {

DDP_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

DDP_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

DDP_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds the 16 dropped bits to nearest, ties to even;
  // a carry moves into the exponent (and past the largest finite value, to infinity).
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

DDP_HOST_DEVICE inline float bf16_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

DDP_HOST_DEVICE inline uint16_t float_to_fp16(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (a < 0x38800000u) {
    // Below 2^-14, fp16's subnormals are multiples of 2^-24, the spacing of float32 just above
    // 0.5: adding 0.5 rounds to one of them, ties to even, and leaves it in the low bits.
    const float shifted = bits_float(a) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(shifted) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits as above.
  const uint32_t rounded = a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

DDP_HOST_DEVICE inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t fraction = h & 0x3ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (fraction << 13));
  if (exponent == 0) {
    // Zero or subnormal: fraction x 2^-24, exact in float32.
    const float magnitude = static_cast<float>(fraction) * bits_float(0x33800000u);
    return bits_float(sign | float_bits(magnitude));
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (fraction << 13));
}

}  // namespace ddp
