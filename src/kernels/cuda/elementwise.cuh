// Elementwise kernels over flat arrays: ReLU forward/backward, fill, scale (by a host value, or
// by a factor a kernel left in device memory: gradient clipping), the fused SGD and Adam steps
// over the whole parameter arena in one launch each, and the count of non-finite values (the
// NaN check). Grid-stride loops over float4s when every pointer is 16-byte aligned
// (then the tail of n % 4 elements goes one by one), sized to fill the device once. Compiled by
// nvcc and by the CPU emulation.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_api.h"

namespace ddp {
namespace cuda {

constexpr int kElementwiseThreads = 256;

/// Blocks for a grid-stride loop over `work` items: enough to fill every multiprocessor a few
/// times, no more (each thread then handles several items).
inline unsigned grid_for(int64_t work, int sm_count) {
  const int64_t needed = ceil_div(work, kElementwiseThreads);
  const int64_t cap = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 8;
  const int64_t blocks = needed < cap ? needed : cap;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Each op is a functor applied to element i; VEC forms take four consecutive elements.
struct ReluForwardOp {
  const float* x;
  float* y;
  __device__ __forceinline__ static float relu(float v) { return v < 0.0f ? 0.0f : v; }
  __device__ __forceinline__ void one(int64_t i) const { y[i] = relu(x[i]); }
  __device__ __forceinline__ void four(int64_t i) const {
    float4 v = *reinterpret_cast<const float4*>(x + i);
    v.x = relu(v.x), v.y = relu(v.y), v.z = relu(v.z), v.w = relu(v.w);
    *reinterpret_cast<float4*>(y + i) = v;
  }
};

// dx = y > 0 ? dy : 0 (a select: torch's threshold_backward).
struct ReluBackwardOp {
  const float* dy;
  const float* y;
  float* dx;
  __device__ __forceinline__ void one(int64_t i) const { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
  __device__ __forceinline__ void four(int64_t i) const {
    const float4 g = *reinterpret_cast<const float4*>(dy + i);
    const float4 o = *reinterpret_cast<const float4*>(y + i);
    float4 r;
    r.x = o.x > 0.0f ? g.x : 0.0f;
    r.y = o.y > 0.0f ? g.y : 0.0f;
    r.z = o.z > 0.0f ? g.z : 0.0f;
    r.w = o.w > 0.0f ? g.w : 0.0f;
    *reinterpret_cast<float4*>(dx + i) = r;
  }
};

struct FillOp {
  float* t;
  float value;
  __device__ __forceinline__ void one(int64_t i) const { t[i] = value; }
  __device__ __forceinline__ void four(int64_t i) const {
    *reinterpret_cast<float4*>(t + i) = make_float4(value, value, value, value);
  }
};

struct ScaleOp {
  float* t;
  float factor;
  __device__ __forceinline__ void one(int64_t i) const { t[i] *= factor; }
  __device__ __forceinline__ void four(int64_t i) const {
    float4 v = *reinterpret_cast<float4*>(t + i);
    v.x *= factor, v.y *= factor, v.z *= factor, v.w *= factor;
    *reinterpret_cast<float4*>(t + i) = v;
  }
};

/// torch.optim.SGD element for element, with the CPU backend's exact operation order (every
/// torch add-with-alpha is one fused multiply-add; buf·momentum is a plain multiply), so the
/// GPU step is bitwise the CPU step.
struct SgdOp {
  float* p;
  const float* g;
  float* buf;
  float lr, weight_decay, momentum, keep;  // keep = 1 - dampening
  bool use_momentum, nesterov, first_step;

  __device__ __forceinline__ void update(float& param, float grad, float& momentum_buf) const {
    if (weight_decay != 0.0f) grad = fmaf(param, weight_decay, grad);
    if (use_momentum) {
      momentum_buf = first_step ? grad : fmaf(grad, keep, momentum_buf * momentum);
      grad = nesterov ? fmaf(momentum_buf, momentum, grad) : momentum_buf;
    }
    param = fmaf(grad, -lr, param);
  }
  __device__ __forceinline__ void one(int64_t i) const {
    float unused = 0.0f;
    update(p[i], g[i], use_momentum ? buf[i] : unused);
  }
  __device__ __forceinline__ void four(int64_t i) const {
    float4 pv = *reinterpret_cast<const float4*>(p + i);
    const float4 gv = *reinterpret_cast<const float4*>(g + i);
    float4 bv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (use_momentum) bv = *reinterpret_cast<const float4*>(buf + i);
    update(pv.x, gv.x, bv.x);
    update(pv.y, gv.y, bv.y);
    update(pv.z, gv.z, bv.z);
    update(pv.w, gv.w, bv.w);
    *reinterpret_cast<float4*>(p + i) = pv;
    if (use_momentum) *reinterpret_cast<float4*>(buf + i) = bv;
  }
};

/// torch.optim.Adam / AdamW element for element (Backend::adam_step), with the CPU backend's
/// exact roundings (kernels/cpu/cpu_optimizers.cpp): the fused steps are fmaf, every other
/// product, quotient and sum a correctly rounded intrinsic nvcc does not contract, so the GPU
/// step is bitwise the CPU step.
struct AdamOp {
  float* p;
  const float* g;
  float* m;
  float* v;
  float* vmax;  // null without amsgrad
  AdamStep s;

  __device__ __forceinline__ void update(float& param, float grad, float& exp_avg,
                                         float& exp_avg_sq, float& max_exp_avg_sq) const {
    if (s.decoupled) {
      param = __fmul_rn(param, s.decay);
    } else if (s.weight_decay != 0.0f) {
      grad = fmaf(param, s.weight_decay, grad);
    }
    exp_avg = fmaf(grad, s.one_minus_beta1, __fmul_rn(exp_avg, s.beta1));
    exp_avg_sq = fmaf(__fmul_rn(s.one_minus_beta2, grad), grad, __fmul_rn(exp_avg_sq, s.beta2));
    float second = exp_avg_sq;
    if (s.amsgrad) {
      // torch.maximum: NaN when either is NaN.
      const bool keep = max_exp_avg_sq > exp_avg_sq || max_exp_avg_sq != max_exp_avg_sq;
      second = max_exp_avg_sq = keep ? max_exp_avg_sq : exp_avg_sq;
    }
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(second), s.bias_correction2_sqrt), s.eps);
    param = __fadd_rn(param, __fdiv_rn(__fmul_rn(s.neg_step_size, exp_avg), denom));
  }
  __device__ __forceinline__ void one(int64_t i) const {
    float unused = 0.0f;
    update(p[i], g[i], m[i], v[i], vmax != nullptr ? vmax[i] : unused);
  }
  __device__ __forceinline__ void four(int64_t i) const {
    float4 pv = *reinterpret_cast<const float4*>(p + i);
    const float4 gv = *reinterpret_cast<const float4*>(g + i);
    float4 mv = *reinterpret_cast<const float4*>(m + i);
    float4 vv = *reinterpret_cast<const float4*>(v + i);
    float4 xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (vmax != nullptr) xv = *reinterpret_cast<const float4*>(vmax + i);
    update(pv.x, gv.x, mv.x, vv.x, xv.x);
    update(pv.y, gv.y, mv.y, vv.y, xv.y);
    update(pv.z, gv.z, mv.z, vv.z, xv.z);
    update(pv.w, gv.w, mv.w, vv.w, xv.w);
    *reinterpret_cast<float4*>(p + i) = pv;
    *reinterpret_cast<float4*>(m + i) = mv;
    *reinterpret_cast<float4*>(v + i) = vv;
    if (vmax != nullptr) *reinterpret_cast<float4*>(vmax + i) = xv;
  }
};

// The grid-stride loop of every elementwise kernel: this thread's share of [0, n).
template <typename Op, bool VEC>
__device__ __forceinline__ void elementwise_loop(const Op& op, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (VEC) {
    const int64_t quads = n / 4;
    for (int64_t q = first; q < quads; q += stride) op.four(4 * q);
    for (int64_t i = 4 * quads + first; i < n; i += stride) op.one(i);
  } else {
    for (int64_t i = first; i < n; i += stride) op.one(i);
  }
}

template <typename Op, bool VEC>
__global__ void elementwise_kernel(Op op, int64_t n) {
  elementwise_loop<Op, VEC>(op, n);
}

/// The grid of an elementwise launch over n values (as float4s with vec).
inline dim3 elementwise_grid(int64_t n, bool vec, int sm_count) {
  return dim3(grid_for(vec ? ceil_div(n, 4) : n, sm_count));
}

/// Runs op over [0, n); `vec` when every pointer the op touches is 16-byte aligned.
template <typename Op>
void launch_elementwise(const Op& op, int64_t n, bool vec, int sm_count, cudaStream_t stream) {
  if (n == 0) return;
  const dim3 grid = elementwise_grid(n, vec, sm_count);
  const dim3 block(kElementwiseThreads);
  if (vec) {
    auto* kernel = &elementwise_kernel<Op, true>;
    DDP_LAUNCH(kernel, grid, block, stream, op, n);
  } else {
    auto* kernel = &elementwise_kernel<Op, false>;
    DDP_LAUNCH(kernel, grid, block, stream, op, n);
  }
}

/// t[0, n) *= *factor, where *factor was written by an earlier kernel on the stream (the clip
/// factor of norm_finish_kernel): each thread reads it once, and where it is exactly 1 (no
/// clipping) nothing is read or written, so t stays bitwise as it was.
template <bool VEC>
__global__ void scale_by_device_kernel(float* t, const float* factor, int64_t n) {
  const float f = *factor;
  if (f == 1.0f) return;
  elementwise_loop<ScaleOp, VEC>(ScaleOp{t, f}, n);
}

/// Launches scale_by_device_kernel over t[0, n); `vec` when t is 16-byte aligned.
inline void launch_scale_by_device(float* t, const float* factor, int64_t n, bool vec, int sm_count,
                                   cudaStream_t stream) {
  if (n == 0) return;
  const dim3 grid = elementwise_grid(n, vec, sm_count);
  const dim3 block(kElementwiseThreads);
  if (vec) {
    DDP_LAUNCH(scale_by_device_kernel<true>, grid, block, stream, t, factor, n);
  } else {
    DDP_LAUNCH(scale_by_device_kernel<false>, grid, block, stream, t, factor, n);
  }
}

/// Adds the number of NaN/±Inf values of t[0, n) to *count: each thread counts its share and
/// adds it once with an integer atomic (exact whatever the order).
__global__ void count_nonfinite_kernel(const float* t, int64_t n, unsigned long long* count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned long long mine = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = t[i];
    mine += (v - v == 0.0f) ? 0u : 1u;  // finite - itself is 0; NaN and ±Inf give NaN
  }
  if (mine != 0) atomicAdd(count, mine);
}

/// Launches count_nonfinite_kernel over t[0, n) on `stream`; *count is zeroed by the caller.
inline void launch_count_nonfinite(const float* t, int64_t n, unsigned long long* count,
                                   int sm_count, cudaStream_t stream) {
  if (n == 0) return;
  DDP_LAUNCH(count_nonfinite_kernel, dim3(grid_for(n, sm_count)), dim3(kElementwiseThreads), stream,
             t, n, count);
}

}  // namespace cuda
}  // namespace ddp
