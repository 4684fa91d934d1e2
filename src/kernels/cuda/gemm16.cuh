// The GEMM of mixed precision (kernels/backend.h's MixedLinear): 16-bit operands (bf16 or fp16)
// on the tensor cores through WMMA (m16n16k16 fragments, float32 accumulators), with the
// Linear layer's epilogue fused into the store: + bias (float32), ReLU, the ReLU-backward mask
// by a 16-bit output, + C (gradient accumulation), written as float32 or rounded to the format
// (core/float16.h, the CPU backend's rounding, bit for bit). A 64 x 64 tile of C per block of
// four warps (32 x 32 each); operand tiles go to shared memory in their global layout, zero
// beyond the matrix's edges (any m, n, k), with 16-byte loads where every operand allows them.
// Deterministic (no atomics; one fixed order per element). bf16 WMMA needs sm_80: on older
// architectures the bf16 kernels are compiled as a trap and the backend refuses bf16 first.
// Compiled by nvcc and by the CPU emulation (emu/cuda_emu_wmma.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/float16.h"
#include "kernels/column_sum_order.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/wmma_api.h"

// Whether this compilation may use bf16 WMMA: the host pass, the emulation and sm_80 and up.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define DDP_BF16_WMMA 0
#else
#define DDP_BF16_WMMA 1
#endif

namespace ddp {
namespace cuda {

/// A 16-bit format as the kernels see it: its roundings (core/float16.h) and its WMMA type.
struct Bf16Gemm {
  using Wmma = __nv_bfloat16;
  static constexpr bool kNeedsSm80 = true;
  __device__ __forceinline__ static uint16_t encode(float v) { return float_to_bf16(v); }
  __device__ __forceinline__ static float decode(uint16_t h) { return bf16_to_float(h); }
};
struct Fp16Gemm {
  using Wmma = __half;
  static constexpr bool kNeedsSm80 = false;
  __device__ __forceinline__ static uint16_t encode(float v) { return float_to_fp16(v); }
  __device__ __forceinline__ static float decode(uint16_t h) { return fp16_to_float(h); }
};

constexpr int kGemm16Bm = 64, kGemm16Bn = 64, kGemm16Bk = 32;
constexpr int kGemm16Threads = 128;  // four warps, 2 x 2, each 32 x 32 of C
constexpr int kGemm16Pad = 8;        // halves after each shared row: ldm stays a multiple of 8

/// Global -> shared: a tile of OUTER rows (the operand's non-contiguous dimension) by INNER
/// contiguous halves, from x[(o0 + o) * ld + i0 + i], stored s[o * (INNER + pad) + i]; zero where
/// o0 + o >= olim or i0 + i >= ilim. VEC: 8 halves per 16-byte load (ilim, ld multiples of 8 and
/// x 16-byte aligned, so eight are all inside or all outside).
template <int OUTER, int INNER, bool VEC>
__device__ __forceinline__ void load_tile16(const uint16_t* __restrict__ x, int64_t ld, int64_t o0,
                                            int64_t olim, int64_t i0, int64_t ilim, uint16_t* s,
                                            int tid) {
  constexpr int kLd = INNER + kGemm16Pad;
  if (VEC) {
    constexpr int kVecs = OUTER * INNER / 8;
    for (int v = tid; v < kVecs; v += kGemm16Threads) {
      const int o = v / (INNER / 8), i = v % (INNER / 8) * 8;
      uint4 val = {0u, 0u, 0u, 0u};
      if (o0 + o < olim && i0 + i < ilim)
        val = *reinterpret_cast<const uint4*>(x + (o0 + o) * ld + i0 + i);
      *reinterpret_cast<uint4*>(s + o * kLd + i) = val;
    }
  } else {
    for (int e = tid; e < OUTER * INNER; e += kGemm16Threads) {
      const int o = e / INNER, i = e % INNER;
      uint16_t val = 0;
      if (o0 + o < olim && i0 + i < ilim) val = x[(o0 + o) * ld + i0 + i];
      s[o * kLd + i] = val;
    }
  }
}

/// C[row, col] from its float32 sum: the fused epilogue, then the store in C's type.
template <class F>
__device__ __forceinline__ void gemm16_store(const Gemm16Args& p, int64_t row, int64_t col,
                                             float v) {
  const int64_t at = row * p.ldc + col;
  if (p.bias != nullptr) v += p.bias[col];
  if (p.relu) v = v < 0.0f ? 0.0f : v;  // NaN kept, as torch.relu
  if (p.c16 != nullptr) {
    // A select, not a multiply: an inf/NaN behind a dead unit must not leak through.
    const bool live = p.mask == nullptr || F::decode(p.mask[at]) > 0.0f;
    p.c16[at] = live ? F::encode(v) : uint16_t{0};
  } else {
    p.c32[at] = p.accumulate ? p.c32[at] + v : v;
  }
}

/// Operand tiles in shared memory, in their global layout: matrix_a row_major when A is
/// k-contiguous (A_KC), col_major otherwise; matrix_b col_major when B is k-contiguous.
template <class F, bool A_KC, bool B_KC>
struct Gemm16Tiles {
  using LayoutA =
      typename std::conditional<A_KC, nvcuda::wmma::row_major, nvcuda::wmma::col_major>::type;
  using LayoutB =
      typename std::conditional<B_KC, nvcuda::wmma::col_major, nvcuda::wmma::row_major>::type;
  static constexpr int kLda = (A_KC ? kGemm16Bk : kGemm16Bm) + kGemm16Pad;
  static constexpr int kLdb = (B_KC ? kGemm16Bk : kGemm16Bn) + kGemm16Pad;
  // Where fragment (row r0 of the tile, k kk) starts, for A; (k kk, column c0), for B.
  __device__ __forceinline__ static const typename F::Wmma* a_at(const uint16_t* s, int r0,
                                                                 int kk) {
    return reinterpret_cast<const typename F::Wmma*>(s + (A_KC ? r0 * kLda + kk : kk * kLda + r0));
  }
  __device__ __forceinline__ static const typename F::Wmma* b_at(const uint16_t* s, int kk,
                                                                 int c0) {
    return reinterpret_cast<const typename F::Wmma*>(s + (B_KC ? c0 * kLdb + kk : kk * kLdb + c0));
  }
};

// Halves of one operand tile, the larger of its two layouts (64 x 40 k-contiguous, 32 x 72).
constexpr int kGemm16TileHalves = kGemm16Bm * (kGemm16Bk + kGemm16Pad) >
                                          kGemm16Bk*(kGemm16Bm + kGemm16Pad)
                                      ? kGemm16Bm*(kGemm16Bk + kGemm16Pad)
                                      : kGemm16Bk*(kGemm16Bm + kGemm16Pad);
static_assert(kGemm16Bm == kGemm16Bn, "A's and B's tiles share one size");
constexpr int kGemm16Ldc = kGemm16Bn + 4;

/// One 64 x 64 tile of C (blockIdx.x numbers the tiles row by row), K in steps of 32.
template <class F, bool A_KC, bool B_KC, bool VEC>
__device__ __forceinline__ void gemm16_tile(const Gemm16Args& p) {
  namespace wmma = nvcuda::wmma;
  using Tiles = Gemm16Tiles<F, A_KC, B_KC>;
  alignas(32) __shared__ uint16_t a_tile16[kGemm16TileHalves];
  DDP_EMU_SHARED(a_tile16);
  alignas(32) __shared__ uint16_t b_tile16[kGemm16TileHalves];
  DDP_EMU_SHARED(b_tile16);
  alignas(32) __shared__ float c_tile16[kGemm16Bm * kGemm16Ldc];
  DDP_EMU_SHARED(c_tile16);

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, wm = warp / 2, wn = warp % 2;
  const int64_t tiles_n = (p.n + kGemm16Bn - 1) / kGemm16Bn;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) / tiles_n * kGemm16Bm;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) % tiles_n * kGemm16Bn;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int64_t k0 = 0; k0 < p.k; k0 += kGemm16Bk) {
    if (A_KC) {
      load_tile16<kGemm16Bm, kGemm16Bk, VEC>(p.a, p.lda, m0, p.m, k0, p.k, a_tile16, tid);
    } else {
      load_tile16<kGemm16Bk, kGemm16Bm, VEC>(p.a, p.lda, k0, p.k, m0, p.m, a_tile16, tid);
    }
    if (B_KC) {
      load_tile16<kGemm16Bn, kGemm16Bk, VEC>(p.b, p.ldb, n0, p.n, k0, p.k, b_tile16, tid);
    } else {
      load_tile16<kGemm16Bk, kGemm16Bn, VEC>(p.b, p.ldb, k0, p.k, n0, p.n, b_tile16, tid);
    }
    __syncthreads();
    DDP_UNROLL
    for (int kk = 0; kk < kGemm16Bk; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, typename F::Wmma, typename Tiles::LayoutA> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, typename F::Wmma, typename Tiles::LayoutB> fb[2];
      for (int i = 0; i < 2; ++i)
        wmma::load_matrix_sync(fa[i], Tiles::a_at(a_tile16, wm * 32 + i * 16, kk), Tiles::kLda);
      for (int j = 0; j < 2; ++j)
        wmma::load_matrix_sync(fb[j], Tiles::b_at(b_tile16, kk, wn * 32 + j * 16), Tiles::kLdb);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    // The tiles are overwritten by the next step's loads.
    __syncthreads();
  }

  // Accumulators through shared memory: the fragments' element mapping is unspecified, so the
  // epilogue reads C by position from there.
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(c_tile16 + (wm * 32 + i * 16) * kGemm16Ldc + wn * 32 + j * 16,
                              acc[i][j], kGemm16Ldc, wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < kGemm16Bm * kGemm16Bn; e += kGemm16Threads) {
    const int r = e / kGemm16Bn, c = e % kGemm16Bn;
    if (m0 + r < p.m && n0 + c < p.n)
      gemm16_store<F>(p, m0 + r, n0 + c, c_tile16[r * kGemm16Ldc + c]);
  }
}

template <class F, bool A_KC, bool B_KC, bool VEC>
__global__ void __launch_bounds__(kGemm16Threads) gemm16_kernel(Gemm16Args p) {
#if DDP_BF16_WMMA
  gemm16_tile<F, A_KC, B_KC, VEC>(p);
#else
  // Never launched: the backend refuses bf16 on devices older than sm_80.
  if constexpr (F::kNeedsSm80) {
    __trap();
  } else {
    gemm16_tile<F, A_KC, B_KC, VEC>(p);
  }
#endif
}

/// db[c] (+)= sum of dy[r, c] over r in kernels/column_sum_order.h's order (the CPU backend's
/// bits): a block of 32 x kColumnSumChunks threads owns 32 columns; thread (x, y) adds chunk y's
/// rows of column x in order (`per` rows a chunk), then row y = 0 adds the chunks' sums in order.
template <class F>
__global__ void column_sums16_kernel(const uint16_t* __restrict__ dy, int64_t rows, int64_t cols,
                                     int64_t per, bool accumulate, float* __restrict__ out) {
  __shared__ float chunk_sums[kColumnSumChunks][33];
  DDP_EMU_SHARED(chunk_sums);
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  float sum = 0.0f;
  if (col < cols) {
    const int64_t first = ty * per;
    const int64_t end = first + per < rows ? first + per : rows;
    for (int64_t r = first; r < end; ++r) sum += F::decode(dy[r * cols + col]);
  }
  chunk_sums[ty][tx] = sum;
  __syncthreads();
  if (ty != 0 || col >= cols) return;
  float total = 0.0f;
  for (int c = 0; c < kColumnSumChunks; ++c) total += chunk_sums[c][tx];
  out[col] = accumulate ? out[col] + total : total;
}

/// Whether every operand of `p` allows 16-byte loads (its contiguous extent and leading
/// dimension multiples of 8 halves, its pointer 16-byte aligned).
inline bool gemm16_vectorizable(const Gemm16Args& p, bool a_k_contiguous, bool b_k_contiguous) {
  auto aligned16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  const int64_t a_inner = a_k_contiguous ? p.k : p.m;
  const int64_t b_inner = b_k_contiguous ? p.k : p.n;
  return a_inner % 8 == 0 && b_inner % 8 == 0 && p.lda % 8 == 0 && p.ldb % 8 == 0 &&
         aligned16(p.a) && aligned16(p.b);
}

template <class F, bool A_KC, bool B_KC>
void launch_gemm16_layout(const Gemm16Args& p, bool vec, cudaStream_t stream) {
  const int64_t tiles = ceil_div(p.m, kGemm16Bm) * ceil_div(p.n, kGemm16Bn);
  if (tiles > kMaxGridX) {
    DDP_THROW("gemm16: " << p.m << " x " << p.n << " needs " << tiles
                         << " tiles, more blocks than a grid holds (" << kMaxGridX << ")");
  }
  const dim3 grid(static_cast<unsigned>(tiles));
  if (vec) {
    auto* kernel = &gemm16_kernel<F, A_KC, B_KC, true>;
    DDP_LAUNCH(kernel, grid, dim3(kGemm16Threads), stream, p);
  } else {
    auto* kernel = &gemm16_kernel<F, A_KC, B_KC, false>;
    DDP_LAUNCH(kernel, grid, dim3(kGemm16Threads), stream, p);
  }
}

template <class F>
void launch_gemm16_format(const Gemm16Args& p, bool a_kc, bool b_kc, bool vec,
                          cudaStream_t stream) {
  if (a_kc && b_kc) {
    launch_gemm16_layout<F, true, true>(p, vec, stream);
  } else if (a_kc && !b_kc) {
    launch_gemm16_layout<F, true, false>(p, vec, stream);
  } else if (!a_kc && !b_kc) {
    launch_gemm16_layout<F, false, false>(p, vec, stream);
  } else {
    DDP_THROW("gemm16: layout A m-contiguous with B k-contiguous is not built");
  }
}

/// C = epilogue(A·B) in `type`, A and B laid out as GemmArgs's (the three layouts of a Linear
/// layer). `vec`: 16-byte loads, only where gemm16_vectorizable says so.
inline void launch_gemm16(Float16Type type, const Gemm16Args& p, bool a_k_contiguous,
                          bool b_k_contiguous, bool vec, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  if (type == Float16Type::Bf16) {
    launch_gemm16_format<Bf16Gemm>(p, a_k_contiguous, b_k_contiguous, vec, stream);
  } else {
    launch_gemm16_format<Fp16Gemm>(p, a_k_contiguous, b_k_contiguous, vec, stream);
  }
}

/// out[c] (+)= column sums of the rows x cols 16-bit dy.
inline void launch_column_sums16(Float16Type type, const uint16_t* dy, int64_t rows, int64_t cols,
                                 bool accumulate, float* out, cudaStream_t stream) {
  if (cols == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, 32)));
  const dim3 block(32, kColumnSumChunks);
  const int64_t per = column_sum_chunk_rows(rows);
  if (type == Float16Type::Bf16) {
    DDP_LAUNCH(column_sums16_kernel<Bf16Gemm>, grid, block, stream, dy, rows, cols, per,
               accumulate, out);
  } else {
    DDP_LAUNCH(column_sums16_kernel<Fp16Gemm>, grid, block, stream, dy, rows, cols, per,
               accumulate, out);
  }
}

}  // namespace cuda
}  // namespace ddp
