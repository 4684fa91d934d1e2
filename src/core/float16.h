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

// Each function computes every case and keeps one with a mask (ternaries become branches that
// stop loops over arrays from vectorising).
DDP_HOST_DEVICE inline uint32_t select_bits(bool keep_a, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(keep_a);
  return (a & mask) | (b & ~mask);
}

DDP_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  // Adding 0x7fff plus the lowest kept bit rounds the 16 dropped bits to nearest, ties to even;
  // a carry moves into the exponent (and past the largest finite value, to infinity).
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x0040u;  // quiet, sign and high payload kept
  return static_cast<uint16_t>(select_bits((x & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

DDP_HOST_DEVICE inline float bf16_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

DDP_HOST_DEVICE inline uint16_t float_to_fp16(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits as bf16 does.
  const uint32_t normal = (a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  // Below 2^-14, fp16's subnormals are multiples of 2^-24, the spacing of float32 just above
  // 0.5: adding 0.5 rounds to one of them, ties to even, and leaves it in the low bits.
  const uint32_t subnormal = float_bits(bits_float(a) + 0.5f) - 0x3f000000u;
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  uint32_t r = select_bits(a < 0x38800000u, subnormal, normal);
  r = select_bits(a >= 0x477ff000u, 0x7c00u, r);  // 65520 and up: infinity
  r = select_bits(a > 0x7f800000u, nan, r);
  return static_cast<uint16_t>(sign | r);
}

DDP_HOST_DEVICE inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and fraction
  const uint32_t exponent = shifted & 0x0f800000u;
  const uint32_t normal = shifted + 0x38000000u;   // rebias 15 -> 127
  const uint32_t special = shifted | 0x7f800000u;  // infinity or NaN
  // Zero or subnormal: rebiased one step higher, the fraction reads as 1.f x 2^-14; taking
  // 2^-14 away leaves f x 2^-14 exactly.
  const uint32_t subnormal = float_bits(bits_float(normal + 0x00800000u) - bits_float(0x38800000u));
  uint32_t r = select_bits(exponent == 0, subnormal, normal);
  r = select_bits(exponent == 0x0f800000u, special, r);
  return bits_float(sign | r);
}

}  // namespace ddp
