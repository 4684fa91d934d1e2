// Tiled fp32 GEMM for the three products of a Linear layer, with the layer's elementwise work
// fused into the store: C[m,n] = sum_k A(m,k)·B(k,n), then (+C if accumulate) (+bias[n]) (ReLU)
// (ReLU-backward mask). Shared-memory tiles double-buffered through registers (one barrier per
// K step), 16-byte loads and stores where the operands allow, each thread owning a TM x TN
// block of C in registers. A split-K plan writes per-slice partial sums that a second kernel
// adds in slice order: deterministic, no atomics. Compiled by nvcc and by the CPU emulation.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/kernel_args.h"

namespace ddp {
namespace cuda {

__device__ __forceinline__ float gemm_epilogue(const GemmArgs& p, int64_t row, int64_t col,
                                               float v) {
  if (p.accumulate) v += p.c[row * p.ldc + col];
  if (p.bias != nullptr) v += p.bias[col];
  if (p.relu) v = v < 0.0f ? 0.0f : v;
  // A select, not a multiply: an inf/NaN behind a dead unit must not leak through as NaN.
  if (p.mask != nullptr) v = p.mask[row * p.ldc + col] > 0.0f ? v : 0.0f;
  return v;
}

/// Moves one operand's tile between global memory, registers and shared memory. The tile has
/// ROWS rows (the operand's m or n extent) by BK k's and is stored in shared memory k-major,
/// S[k][row], so the inner product loop reads consecutive rows with 16-byte loads whatever the
/// operand's layout in global memory.
template <int ROWS, int BK, int THREADS, bool K_CONTIGUOUS, bool VEC>
struct TileIo {
  static constexpr int kElems = ROWS * BK / THREADS;  // floats per thread per tile
  static_assert((ROWS * BK) % (THREADS * (VEC ? 4 : 1)) == 0, "tile does not split evenly");
  static_assert(kElems % (VEC ? 4 : 1) == 0, "tile does not split evenly");

  // A thread's loads l = 0, 1, ... sit at i = tid + l·THREADS; THREADS is a multiple of the
  // tile's extent along the contiguous dimension, so load l is load 0 moved by l·kStep along
  // the other one (rows for a k-contiguous operand, k's otherwise). A pointer advanced per K
  // tile and one row count then carry a thread across the slice: no 64-bit offset is
  // recomputed per load, and little stays live beside the accumulators.
  static constexpr int kPerLine = K_CONTIGUOUS ? (VEC ? BK / 4 : BK) : (VEC ? ROWS / 4 : ROWS);
  static_assert(THREADS % kPerLine == 0, "a thread's loads do not keep one offset");
  static constexpr int kStep = THREADS / kPerLine;

  /// Where this thread's load 0 of the current K tile is. rows_left is 32-bit: rows <= 2^31 - 1
  /// and r0 < rows, so it lies in (-ROWS, rows].
  struct Cursor {
    const float* at;  ///< element (row r0 + r, k k0 + k) of load 0; formed, read only in range
    int rows_left;    ///< rows - (r0 + r): load l is in range while its row offset is below it
  };

  // The cursor of the tile at rows [r0, r0 + ROWS), k's [k0, k0 + BK), for x with leading
  // dimension ld. r0 < rows.
  __device__ __forceinline__ static Cursor start(const float* x, int64_t ld, int r0, int rows,
                                                 int k0, int tid) {
    int r, k;
    position(tid, r, k);
    Cursor c;
    c.at = K_CONTIGUOUS ? x + (static_cast<int64_t>(r0) + r) * ld + (k0 + k)
                        : x + static_cast<int64_t>(k0 + k) * ld + (r0 + r);
    c.rows_left = (rows - r0) - r;
    return c;
  }

  // The same thread's cursor one K tile on.
  __device__ __forceinline__ static void advance(Cursor& c, int64_t ld) {
    c.at += K_CONTIGUOUS ? static_cast<int64_t>(BK) : BK * ld;
  }

  // Global → registers, for the tile whose slice has k_rest k's left from its first. The K
  // count is the caller's, one for both operands (a count per operand spilled on sm_90).
  // Out-of-range elements read as 0.
  __device__ __forceinline__ static void load(const Cursor& c, int64_t ld, int k_rest, int tid,
                                              float* reg) {
    int r, k;
    position(tid, r, k);
    if (VEC) {
      DDP_UNROLL
      for (int l = 0; l < kElems / 4; ++l) {
        const int dr = K_CONTIGUOUS ? l * kStep : 0;
        const int dk = K_CONTIGUOUS ? 0 : l * kStep;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        // With VEC the contiguous extent is a multiple of 4: a float4 is all in or all out.
        if (dr < c.rows_left && k + dk < k_rest)
          v = *reinterpret_cast<const float4*>(c.at + static_cast<int64_t>(dr + dk) * ld);
        reg[4 * l + 0] = v.x;
        reg[4 * l + 1] = v.y;
        reg[4 * l + 2] = v.z;
        reg[4 * l + 3] = v.w;
      }
    } else {
      // Stepped, not l·step: ptxas kept the products l·step live across the K loop and spilled.
      const float* x = c.at;
      const int64_t step = kStep * ld;
      DDP_UNROLL
      for (int l = 0; l < kElems; ++l) {
        const int dr = K_CONTIGUOUS ? l * kStep : 0;
        const int dk = K_CONTIGUOUS ? 0 : l * kStep;
        float v = 0.0f;
        if (dr < c.rows_left && k + dk < k_rest) v = *x;
        reg[l] = v;
        x += step;
      }
    }
  }

  // Registers → shared memory tile s[BK][ROWS + 4].
  __device__ __forceinline__ static void store(float (*s)[ROWS + 4], int tid, const float* reg) {
    int r, k;
    position(tid, r, k);
    if (VEC) {
      DDP_UNROLL
      for (int l = 0; l < kElems / 4; ++l) {
        const int rl = K_CONTIGUOUS ? r + l * kStep : r;
        const int kl = K_CONTIGUOUS ? k : k + l * kStep;
        if (K_CONTIGUOUS) {
          // Four k's of one row: a transposed store.
          s[kl + 0][rl] = reg[4 * l + 0];
          s[kl + 1][rl] = reg[4 * l + 1];
          s[kl + 2][rl] = reg[4 * l + 2];
          s[kl + 3][rl] = reg[4 * l + 3];
        } else {
          *reinterpret_cast<float4*>(&s[kl][rl]) =
              make_float4(reg[4 * l + 0], reg[4 * l + 1], reg[4 * l + 2], reg[4 * l + 3]);
        }
      }
    } else {
      DDP_UNROLL
      for (int l = 0; l < kElems; ++l) {
        const int rl = K_CONTIGUOUS ? r + l * kStep : r;
        const int kl = K_CONTIGUOUS ? k : k + l * kStep;
        s[kl][rl] = reg[l];
      }
    }
  }

  // The tile position of a thread's load 0: consecutive threads take consecutive addresses
  // along the contiguous dimension; with VEC a load is four k's of one row (k-contiguous
  // operand) or four rows of one k.
  __device__ __forceinline__ static void position(int tid, int& r, int& k) {
    if (K_CONTIGUOUS) {
      r = tid / kPerLine;
      k = (tid % kPerLine) * (VEC ? 4 : 1);
    } else {
      k = tid / kPerLine;
      r = (tid % kPerLine) * (VEC ? 4 : 1);
    }
  }
};

/// One BM x BN tile of C per block, (BM/TM)·(BN/TN) threads. blockIdx.x numbers the tiles row
/// by row (a grid's y and z extents stop at 65535, which a batch of 2^21 rows would pass);
/// blockIdx.z is the K slice.
/// A thread's TM rows are TM/4 groups of 4 consecutive rows spaced BM·4/TM apart (likewise its
/// columns), so the warp's 16-byte shared-memory reads fall in distinct banks. The 128x128
/// tile asks for two resident blocks per multiprocessor (<= 128 registers per thread) so one
/// block's loads overlap the other's arithmetic.
template <int BM, int BN, int BK, int TM, int TN, bool A_KC, bool B_KC, bool VEC>
__global__ void __launch_bounds__((BM / TM) * (BN / TN), BM >= 128 ? 2 : 1)
    gemm_kernel(GemmArgs p) {
  constexpr int kThreads = (BM / TM) * (BN / TN);
  constexpr int kThreadsX = BN / TN;
  constexpr int kRowStride = BM * 4 / TM;
  constexpr int kColStride = BN * 4 / TN;
  static_assert(TM % 4 == 0 && TN % 4 == 0, "thread tiles are groups of 4");
  using LoadA = TileIo<BM, BK, kThreads, A_KC, VEC>;
  using LoadB = TileIo<BN, BK, kThreads, B_KC, VEC>;

  alignas(16) __shared__ float a_tile[2][BK][BM + 4];
  DDP_EMU_SHARED(a_tile);
  alignas(16) __shared__ float b_tile[2][BK][BN + 4];
  DDP_EMU_SHARED(b_tile);

  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % kThreadsX;
  const int ty = tid / kThreadsX;
  // 32-bit tile indices: m, n and K are at most 2^31 - 1, and a tile's first row or column is
  // below m or n.
  const unsigned tiles_n = (static_cast<unsigned>(p.n) + BN - 1) / BN;
  const int m0 = static_cast<int>(blockIdx.x / tiles_n) * BM;
  const int n0 = static_cast<int>(blockIdx.x % tiles_n) * BN;
  const int kbegin = static_cast<int>(blockIdx.z) * p.k_per_split;
  // kbegin < K, so K - kbegin cannot overflow where kbegin + k_per_split could.
  const int kend = p.k - kbegin < p.k_per_split ? p.k : kbegin + p.k_per_split;

  float acc[TM][TN];
  DDP_UNROLL
  for (int i = 0; i < TM; ++i) {
    DDP_UNROLL
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
  }

  float a_reg[LoadA::kElems];
  float b_reg[LoadB::kElems];
  typename LoadA::Cursor a_at = LoadA::start(p.a, p.lda, m0, p.m, kbegin, tid);
  typename LoadB::Cursor b_at = LoadB::start(p.b, p.ldb, n0, p.n, kbegin, tid);
  int k_rest = kend > kbegin ? kend - kbegin : 0;  // k's of the slice from the current tile on
  if (k_rest > 0) {
    LoadA::load(a_at, p.lda, k_rest, tid, a_reg);
    LoadB::load(b_at, p.ldb, k_rest, tid, b_reg);
    LoadA::store(a_tile[0], tid, a_reg);
    LoadB::store(b_tile[0], tid, b_reg);
  }
  __syncthreads();

  // Two K tiles per pass make the buffer index a constant in each, so the shared-memory
  // addresses are immediates; looped once per tile, sm_90 spilled 4 bytes (both operands
  // k-contiguous and vectorised).
#if defined(__CUDACC__)
#pragma unroll 2
#endif
  for (int cur = 0; k_rest > 0; cur ^= 1) {
    const bool more = k_rest > BK;
    k_rest -= BK;
    // The next tile's global loads are in flight while this tile is multiplied.
    if (more) {
      LoadA::advance(a_at, p.lda);
      LoadB::advance(b_at, p.ldb);
      LoadA::load(a_at, p.lda, k_rest, tid, a_reg);
      LoadB::load(b_at, p.ldb, k_rest, tid, b_reg);
    }
    DDP_UNROLL
    for (int kk = 0; kk < BK; ++kk) {
      float a_frag[TM], b_frag[TN];
      DDP_UNROLL
      for (int g = 0; g < TM / 4; ++g) {
        const float4 v =
            *reinterpret_cast<const float4*>(&a_tile[cur][kk][g * kRowStride + ty * 4]);
        a_frag[4 * g + 0] = v.x;
        a_frag[4 * g + 1] = v.y;
        a_frag[4 * g + 2] = v.z;
        a_frag[4 * g + 3] = v.w;
      }
      DDP_UNROLL
      for (int g = 0; g < TN / 4; ++g) {
        const float4 v =
            *reinterpret_cast<const float4*>(&b_tile[cur][kk][g * kColStride + tx * 4]);
        b_frag[4 * g + 0] = v.x;
        b_frag[4 * g + 1] = v.y;
        b_frag[4 * g + 2] = v.z;
        b_frag[4 * g + 3] = v.w;
      }
      DDP_UNROLL
      for (int i = 0; i < TM; ++i) {
        DDP_UNROLL
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a_frag[i], b_frag[j], acc[i][j]);
      }
    }
    // The other buffer was last read before the previous barrier: safe to overwrite now.
    if (more) {
      LoadA::store(a_tile[cur ^ 1], tid, a_reg);
      LoadB::store(b_tile[cur ^ 1], tid, b_reg);
    }
    __syncthreads();
  }

  DDP_UNROLL
  for (int i = 0; i < TM; ++i) {
    const int64_t row = m0 + (i / 4) * kRowStride + ty * 4 + (i % 4);
    if (row >= p.m) continue;
    DDP_UNROLL
    for (int g = 0; g < TN / 4; ++g) {
      const int64_t col = n0 + g * kColStride + tx * 4;
      if (col >= p.n) continue;
      const float* v = &acc[i][4 * g];
      if (p.partial != nullptr) {
        float* out = p.partial + static_cast<int64_t>(blockIdx.z) * p.m * p.n + row * p.n + col;
        if (VEC) {
          *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
          for (int j = 0; j < 4 && col + j < p.n; ++j) out[j] = v[j];
        }
      } else if (VEC) {
        float4 r;
        r.x = gemm_epilogue(p, row, col + 0, v[0]);
        r.y = gemm_epilogue(p, row, col + 1, v[1]);
        r.z = gemm_epilogue(p, row, col + 2, v[2]);
        r.w = gemm_epilogue(p, row, col + 3, v[3]);
        *reinterpret_cast<float4*>(p.c + row * p.ldc + col) = r;
      } else {
        for (int j = 0; j < 4 && col + j < p.n; ++j)
          p.c[row * p.ldc + col + j] = gemm_epilogue(p, row, col + j, v[j]);
      }
    }
  }
}

/// Split-K second pass: C = epilogue(sum of the slices' partial sums, in slice order).
__global__ void gemm_splitk_reduce_kernel(GemmArgs p, int splits) {
  const int64_t total = static_cast<int64_t>(p.m) * p.n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    float v = 0.0f;
    for (int z = 0; z < splits; ++z) v += p.partial[z * total + idx];
    const int64_t row = idx / p.n;
    const int64_t col = idx % p.n;
    p.c[row * p.ldc + col] = gemm_epilogue(p, row, col, v);
  }
}

/// The tile shapes a GemmPlan's `tile` selects.
struct GemmTile {
  int bm, bn, bk;
};
inline GemmTile gemm_tile(int tile) {
  switch (tile) {
    case 0:
      return {128, 128, 8};
    case 1:
      return {64, 64, 16};
    default:
      return {32, 32, 16};
  }
}

template <int BM, int BN, int BK, int TM, int TN, bool A_KC, bool B_KC>
void launch_gemm_tile(const GemmArgs& p, int splits, bool vec, cudaStream_t stream) {
  const int64_t tiles = ceil_div(p.n, BN) * ceil_div(p.m, BM);
  if (tiles > kMaxGridX) {
    DDP_THROW("gemm: " << p.m << " x " << p.n << " needs " << tiles << " tiles of " << BM << " x "
                       << BN << ", more blocks than a grid holds (" << kMaxGridX << ")");
  }
  const dim3 grid(static_cast<unsigned>(tiles), 1, static_cast<unsigned>(splits));
  const dim3 block((BM / TM) * (BN / TN));
  if (vec) {
    auto* kernel = &gemm_kernel<BM, BN, BK, TM, TN, A_KC, B_KC, true>;
    DDP_LAUNCH(kernel, grid, block, stream, p);
  } else {
    auto* kernel = &gemm_kernel<BM, BN, BK, TM, TN, A_KC, B_KC, false>;
    DDP_LAUNCH(kernel, grid, block, stream, p);
  }
}

template <bool A_KC, bool B_KC>
void launch_gemm_layout(const GemmArgs& p, const GemmPlan& plan, cudaStream_t stream) {
  switch (plan.tile) {
    case 0:
      launch_gemm_tile<128, 128, 8, 8, 8, A_KC, B_KC>(p, plan.splits, plan.vectorized, stream);
      break;
    case 1:
      launch_gemm_tile<64, 64, 16, 4, 4, A_KC, B_KC>(p, plan.splits, plan.vectorized, stream);
      break;
    default:
      launch_gemm_tile<32, 32, 16, 4, 4, A_KC, B_KC>(p, plan.splits, plan.vectorized, stream);
      break;
  }
}

/// The number of floats of split-K workspace a plan needs for an m x n product.
inline int64_t gemm_workspace_floats(const GemmPlan& plan, int64_t m, int64_t n) {
  return plan.splits > 1 ? plan.splits * m * n : 0;
}

/// K range of one slice: a multiple of 64 (every tile's BK divides it).
inline int gemm_k_per_split(int k, int splits) {
  const int per = static_cast<int>(ceil_div(k, splits));
  return static_cast<int>(ceil_div(per, 64) * 64);
}

/// Runs C = epilogue(A·B) with `plan`. Only the three layouts a Linear layer needs exist:
/// forward (A k-contiguous, B k-contiguous), input gradient (A k-contig, B n-contig) and
/// weight gradient (A m-contig, B n-contig). `workspace` holds gemm_workspace_floats().
inline void launch_gemm(GemmArgs p, GemmPlan plan, bool a_k_contiguous, bool b_k_contiguous,
                        float* workspace, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  if (p.k == 0) plan.splits = 1;
  p.k_per_split = p.k == 0 ? 64 : gemm_k_per_split(p.k, plan.splits);
  const int splits = p.k == 0 ? 1 : static_cast<int>(ceil_div(p.k, p.k_per_split));
  GemmArgs pass1 = p;
  if (splits > 1) pass1.partial = workspace;
  if (a_k_contiguous && b_k_contiguous) {
    launch_gemm_layout<true, true>(pass1, plan, stream);
  } else if (a_k_contiguous && !b_k_contiguous) {
    launch_gemm_layout<true, false>(pass1, plan, stream);
  } else if (!a_k_contiguous && !b_k_contiguous) {
    launch_gemm_layout<false, false>(pass1, plan, stream);
  } else {
    DDP_THROW("gemm: layout A m-contiguous with B k-contiguous is not built");
  }
  if (splits > 1) {
    GemmArgs pass2 = p;
    pass2.partial = workspace;
    const int64_t total = static_cast<int64_t>(p.m) * p.n;
    const unsigned blocks =
        static_cast<unsigned>(ceil_div(total, 256) < 4096 ? ceil_div(total, 256) : 4096);
    DDP_LAUNCH(gemm_splitk_reduce_kernel, dim3(blocks), dim3(256), stream, pass2, splits);
  }
}

}  // namespace cuda
}  // namespace ddp
