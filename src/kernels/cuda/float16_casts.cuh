// The casts of gradient compression (distributed.compression): float32 to a 16-bit float type
// and back (core/float16.h: round to nearest even, fp16 overflowing to infinity, NaN kept;
// decoding exact), as elementwise ops (elementwise.cuh). Four values at a time when the floats
// are 16-byte aligned and the 16-bit values 8-byte aligned, which a bucket at any multiple of
// four values into its arena is. Compiled by nvcc and by the CPU emulation.
#pragma once

#include <cstdint>

#include "core/float16.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/kernel_args.h"

namespace ddp {
namespace cuda {

struct Bf16Codec {
  __device__ __forceinline__ static uint16_t encode(float v) { return float_to_bf16(v); }
  __device__ __forceinline__ static float decode(uint16_t h) { return bf16_to_float(h); }
};

struct Fp16Codec {
  __device__ __forceinline__ static uint16_t encode(float v) { return float_to_fp16(v); }
  __device__ __forceinline__ static float decode(uint16_t h) { return fp16_to_float(h); }
};

// out[i] = in[i] in the codec's type. Four values go out as one 8-byte store, the first in the
// low bits (both hosts and devices are little-endian).
template <typename Codec>
struct EncodeOp {
  const float* in;
  uint16_t* out;
  __device__ __forceinline__ void one(int64_t i) const { out[i] = Codec::encode(in[i]); }
  __device__ __forceinline__ void four(int64_t i) const {
    const float4 v = *reinterpret_cast<const float4*>(in + i);
    const uint64_t packed = uint64_t{Codec::encode(v.x)} | uint64_t{Codec::encode(v.y)} << 16 |
                            uint64_t{Codec::encode(v.z)} << 32 | uint64_t{Codec::encode(v.w)} << 48;
    *reinterpret_cast<uint64_t*>(out + i) = packed;
  }
};

// out[i] = the float value of in[i] (exact).
template <typename Codec>
struct DecodeOp {
  const uint16_t* in;
  float* out;
  __device__ __forceinline__ void one(int64_t i) const { out[i] = Codec::decode(in[i]); }
  __device__ __forceinline__ void four(int64_t i) const {
    const uint64_t packed = *reinterpret_cast<const uint64_t*>(in + i);
    float4 v;
    v.x = Codec::decode(static_cast<uint16_t>(packed));
    v.y = Codec::decode(static_cast<uint16_t>(packed >> 16));
    v.z = Codec::decode(static_cast<uint16_t>(packed >> 32));
    v.w = Codec::decode(static_cast<uint16_t>(packed >> 48));
    *reinterpret_cast<float4*>(out + i) = v;
  }
};

/// Whether a cast between `floats` and `halves` may take four values at a time.
inline bool cast_vectorizable(const float* floats, const uint16_t* halves) {
  return aligned16(floats) && (reinterpret_cast<uintptr_t>(halves) & 7u) == 0;
}

/// out[0, n) = in[0, n) rounded to `type`, queued on `stream`.
inline void launch_cast_to_16bit(Float16Type type, const float* in, int64_t n, uint16_t* out,
                                 int sm_count, cudaStream_t stream) {
  const bool vec = cast_vectorizable(in, out);
  if (type == Float16Type::Bf16) {
    launch_elementwise(EncodeOp<Bf16Codec>{in, out}, n, vec, sm_count, stream);
  } else {
    launch_elementwise(EncodeOp<Fp16Codec>{in, out}, n, vec, sm_count, stream);
  }
}

/// out[0, n) = the float values of in[0, n) of `type`, queued on `stream`.
inline void launch_cast_from_16bit(Float16Type type, const uint16_t* in, int64_t n, float* out,
                                   int sm_count, cudaStream_t stream) {
  const bool vec = cast_vectorizable(out, in);
  if (type == Float16Type::Bf16) {
    launch_elementwise(DecodeOp<Bf16Codec>{in, out}, n, vec, sm_count, stream);
  } else {
    launch_elementwise(DecodeOp<Fp16Codec>{in, out}, n, vec, sm_count, stream);
  }
}

}  // namespace cuda
}  // namespace ddp
