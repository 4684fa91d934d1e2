// Reductions without atomics, so every result is bitwise reproducible: column sums (the bias
// gradient, rows split into chunks over the grid), fused softmax cross-entropy (one warp per
// row: max, argmax, sum of exp, loss, dlogits in one pass over the row in registers; per-row
// losses summed in a fixed two-level order) and the gradients' L2 norm with clip_grad_norm_'s
// factor. How the grids are sized: reduction_plan.h. Compiled by nvcc and the CPU emulation.
#pragma once

#include <cstdint>

#include "kernels/cuda/block_sum.cuh"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/reduction_plan.h"

namespace ddp {
namespace cuda {

// ---------------------------------------------------------------------------------------------
// Column sums: db[c] (+)= sum_r dy[r, c], in an order that depends on (rows, cols) alone
// (reduction_plan.h: column_sum_chunks). A block owns 32 columns and one chunk of consecutive
// rows; its 8 rows of threads stride down the chunk, then the 8 partial sums of each column are
// added in row-of-threads order. One chunk: that is db. Several (grid.y): each chunk's sums go
// to scratch, [chunk][col], and column_sums_finish_kernel adds them per column in chunk order.

constexpr int kColumnSumRows = 8;
constexpr int kColumnSumFinishThreads = 128;

/// The sums of rows [blockIdx.y·chunk_rows, +chunk_rows) of 32 columns: into partials[blockIdx.y]
/// when partials is set, else (one chunk) into out, added to it with accumulate.
__global__ void column_sums_kernel(const float* __restrict__ dy, int64_t rows, int64_t cols,
                                   int64_t chunk_rows, bool accumulate, float* __restrict__ out,
                                   float* __restrict__ partials) {
  __shared__ float partial[kColumnSumRows][33];
  DDP_EMU_SHARED(partial);
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t end = rows - first < chunk_rows ? rows : first + chunk_rows;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t r = first + ty; r < end; r += kColumnSumRows) sum += dy[r * cols + col];
  }
  partial[ty][tx] = sum;
  __syncthreads();
  if (ty == 0 && col < cols) {
    float total = 0.0f;
    for (int i = 0; i < kColumnSumRows; ++i) total += partial[i][tx];
    if (partials != nullptr) {
      partials[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
    } else {
      out[col] = accumulate ? out[col] + total : total;
    }
  }
}

/// One thread per column: out[col] (+)= the chunks' sums of the column, added in chunk order.
__global__ void column_sums_finish_kernel(const float* __restrict__ partials, int64_t chunks,
                                          int64_t cols, bool accumulate, float* __restrict__ out) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnSumFinishThreads + threadIdx.x;
  if (col >= cols) return;
  float total = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) total += partials[c * cols + col];
  out[col] = accumulate ? out[col] + total : total;
}

/// Queues out[c] (+)= sum_r dy[r, c]; `partials` holds column_sum_scratch_floats(rows, cols)
/// floats (unused, and may be null, when that is 0).
inline void launch_column_sums(const float* dy, int64_t rows, int64_t cols, bool accumulate,
                               float* partials, float* out, cudaStream_t stream) {
  if (cols == 0) return;
  const ColumnSumChunks plan = column_sum_chunks(rows, cols);
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, 32)), static_cast<unsigned>(plan.chunks));
  const dim3 block(32, kColumnSumRows);
  if (plan.chunks == 1) {
    DDP_LAUNCH(column_sums_kernel, grid, block, stream, dy, rows, cols, rows, accumulate, out,
               static_cast<float*>(nullptr));
    return;
  }
  DDP_LAUNCH(column_sums_kernel, grid, block, stream, dy, rows, cols, plan.chunk_rows, false, out,
             partials);
  DDP_LAUNCH(column_sums_finish_kernel,
             dim3(static_cast<unsigned>(ceil_div(cols, kColumnSumFinishThreads))),
             dim3(kColumnSumFinishThreads), stream, partials, plan.chunks, cols, accumulate, out);
}

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy.

constexpr int kXentWarpsPerBlock = 8;
constexpr int kXentReduceThreads = 256;

// (value, index) of the larger value; on a tie the smaller index, like torch.argmax's first
// maximum.
__device__ __forceinline__ void argmax_merge(float& value, int& index, float other_value,
                                             int other_index) {
  if (other_value > value || (other_value == value && other_index < index)) {
    value = other_value;
    index = other_index;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  DDP_UNROLL
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// One warp per row. VPL > 0: the row (classes <= 32·VPL) stays in registers, one read of the
/// logits and one write of dlogits; VPL == 0: any width, reading the row three times. `logits`
/// is not __restrict__: dlogits may alias it, and a restrict pointer that aliases another
/// written pointer is undefined behaviour. Every read precedes the lane's writes in program
/// order, so the row is still read once.
template <int VPL>
__global__ void xent_rows_kernel(const float* logits, const int32_t* __restrict__ labels,
                                 int64_t rows, int classes, float grad_scale, float* dlogits,
                                 XentRowOut out) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * kXentWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (row >= rows) return;  // whole warps leave together; no block barrier in this kernel
  const float* l = logits + row * classes;
  // Every lane reads the label's logit now, before the shuffles below: dlogits may alias the
  // logits, and no lane writes until all lanes have passed those shuffles.
  const int32_t label = labels[row];
  const bool valid = label >= 0 && label < classes;
  const float label_logit = valid ? l[label] : 0.0f;
  constexpr int kCache = VPL > 0 ? VPL : 1;
  float v[kCache];

  float max_value = -INFINITY;
  int argmax = 0x7fffffff;
  if (VPL > 0) {
    DDP_UNROLL
    for (int j = 0; j < kCache; ++j) {
      const int c = lane + 32 * j;
      v[j] = c < classes ? l[c] : -INFINITY;
      if (c < classes) argmax_merge(max_value, argmax, v[j], c);
    }
  } else {
    for (int c = lane; c < classes; c += 32) argmax_merge(max_value, argmax, l[c], c);
  }
  DDP_UNROLL
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_value = __shfl_xor_sync(0xffffffffu, max_value, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, argmax, offset);
    argmax_merge(max_value, argmax, other_value, other_index);
  }

  float sum = 0.0f;
  if (VPL > 0) {
    DDP_UNROLL
    for (int j = 0; j < kCache; ++j)
      if (lane + 32 * j < classes) sum += expf(v[j] - max_value);
  } else {
    for (int c = lane; c < classes; c += 32) sum += expf(l[c] - max_value);
  }
  sum = warp_sum(sum);
  const float lse = max_value + logf(sum);

  if (lane == 0) {
    out.loss[row] = valid ? static_cast<double>(lse) - static_cast<double>(label_logit) : 0.0;
    out.status[row] = !valid ? -1 : (argmax == label ? 1 : 0);
  }
  if (dlogits == nullptr) return;
  // dlogits may alias logits: with VPL > 0 the row is in registers; the three-pass form reads
  // each element in the same lane just before writing it.
  float* d = dlogits + row * classes;
  if (VPL > 0) {
    DDP_UNROLL
    for (int j = 0; j < kCache; ++j) {
      const int c = lane + 32 * j;
      if (c >= classes) continue;
      float prob = expf(v[j] - lse);
      if (c == label) prob -= 1.0f;
      d[c] = prob * grad_scale;
    }
  } else {
    for (int c = lane; c < classes; c += 32) {
      float prob = expf(l[c] - lse);
      if (c == label) prob -= 1.0f;
      d[c] = prob * grad_scale;
    }
  }
}

// Adds a block's per-thread (loss, correct, first bad row) in a fixed tree over the
// kXentReduceThreads threads; thread 0 gets the block's totals. Every thread calls it.
__device__ __forceinline__ void xent_block_tree(double my_loss, long long my_correct,
                                                long long my_bad, double* loss, long long* correct,
                                                long long* bad) {
  const int t = static_cast<int>(threadIdx.x);
  loss[t] = my_loss;
  correct[t] = my_correct;
  bad[t] = my_bad;
  __syncthreads();
  for (int width = kXentReduceThreads / 2; width > 0; width >>= 1) {
    if (t < width) {
      loss[t] += loss[t + width];
      correct[t] += correct[t + width];
      const long long other = bad[t + width];
      if (other >= 0 && (bad[t] < 0 || other < bad[t])) bad[t] = other;
    }
    __syncthreads();
  }
}

// The batch's totals into *totals, or added to them with accumulate (the first bad row kept).
__device__ __forceinline__ void xent_store_totals(double loss, long long correct, long long bad,
                                                  const int32_t* labels, bool accumulate,
                                                  XentTotals* totals) {
  const bool keep_bad = accumulate && totals->first_bad_row >= 0;
  totals->loss_sum = accumulate ? totals->loss_sum + loss : loss;
  totals->correct = accumulate ? totals->correct + correct : correct;
  if (!keep_bad) {
    totals->first_bad_row = bad;
    totals->bad_label = bad >= 0 ? labels[bad] : 0;
  }
}

/// First pass, xent_total_blocks(rows) blocks: global thread g adds rows g, g + T, ... in order
/// (T threads in the grid), then a fixed tree per block. One block stores the batch's totals
/// (partials null); several leave one partial each in partials[blockIdx.x].
__global__ void xent_reduce_kernel(XentRowOut in, const int32_t* __restrict__ labels, int64_t rows,
                                   bool accumulate, XentTotals* totals, XentTotals* partials) {
  __shared__ double loss[kXentReduceThreads];
  DDP_EMU_SHARED(loss);
  __shared__ long long correct[kXentReduceThreads];
  DDP_EMU_SHARED(correct);
  __shared__ long long bad[kXentReduceThreads];
  DDP_EMU_SHARED(bad);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kXentReduceThreads;
  double my_loss = 0.0;
  long long my_correct = 0;
  long long my_bad = -1;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kXentReduceThreads + threadIdx.x; r < rows;
       r += stride) {
    my_loss += in.loss[r];
    const int s = in.status[r];
    if (s > 0) ++my_correct;
    if (s < 0 && my_bad < 0) my_bad = r;
  }
  xent_block_tree(my_loss, my_correct, my_bad, loss, correct, bad);
  if (threadIdx.x != 0) return;
  if (partials == nullptr) {
    xent_store_totals(loss[0], correct[0], bad[0], labels, accumulate, totals);
  } else {
    partials[blockIdx.x] = XentTotals{loss[0], correct[0], bad[0], 0};
  }
}

/// Second pass, one block: thread t adds partials t, t + 256, ... in order, then the fixed
/// tree; the first bad row is the smallest of the blocks' first bad rows.
__global__ void xent_finish_kernel(const XentTotals* __restrict__ partials, int count,
                                   const int32_t* __restrict__ labels, bool accumulate,
                                   XentTotals* totals) {
  __shared__ double finish_loss[kXentReduceThreads];
  DDP_EMU_SHARED(finish_loss);
  __shared__ long long finish_correct[kXentReduceThreads];
  DDP_EMU_SHARED(finish_correct);
  __shared__ long long finish_bad[kXentReduceThreads];
  DDP_EMU_SHARED(finish_bad);
  double my_loss = 0.0;
  long long my_correct = 0;
  long long my_bad = -1;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += kXentReduceThreads) {
    my_loss += partials[i].loss_sum;
    my_correct += partials[i].correct;
    // The blocks' rows interleave (grid stride): the smallest bad row, not the first block's.
    const long long b = partials[i].first_bad_row;
    if (b >= 0 && (my_bad < 0 || b < my_bad)) my_bad = b;
  }
  xent_block_tree(my_loss, my_correct, my_bad, finish_loss, finish_correct, finish_bad);
  if (threadIdx.x == 0) {
    xent_store_totals(finish_loss[0], finish_correct[0], finish_bad[0], labels, accumulate, totals);
  }
}

/// Queues the per-row pass and the totals' one or two; `totals` (device memory) holds the
/// result when the stream gets there (added to what it held, with accumulate). scratch.partials
/// holds xent_total_blocks(rows) totals.
inline void launch_softmax_xent(const float* logits, const int32_t* labels, int64_t rows,
                                int classes, float grad_scale, float* dlogits, XentRowOut scratch,
                                bool accumulate, XentTotals* totals, cudaStream_t stream) {
  if (rows > 0) {
    const dim3 grid(static_cast<unsigned>(ceil_div(rows, kXentWarpsPerBlock)));
    const dim3 block(32 * kXentWarpsPerBlock);
    const int vpl = static_cast<int>(ceil_div(classes, 32));
    if (vpl <= 1) {
      DDP_LAUNCH(xent_rows_kernel<1>, grid, block, stream, logits, labels, rows, classes,
                 grad_scale, dlogits, scratch);
    } else if (vpl <= 2) {
      DDP_LAUNCH(xent_rows_kernel<2>, grid, block, stream, logits, labels, rows, classes,
                 grad_scale, dlogits, scratch);
    } else if (vpl <= 4) {
      DDP_LAUNCH(xent_rows_kernel<4>, grid, block, stream, logits, labels, rows, classes,
                 grad_scale, dlogits, scratch);
    } else if (vpl <= 8) {
      DDP_LAUNCH(xent_rows_kernel<8>, grid, block, stream, logits, labels, rows, classes,
                 grad_scale, dlogits, scratch);
    } else if (vpl <= 16) {
      DDP_LAUNCH(xent_rows_kernel<16>, grid, block, stream, logits, labels, rows, classes,
                 grad_scale, dlogits, scratch);
    } else if (vpl <= 32) {
      DDP_LAUNCH(xent_rows_kernel<32>, grid, block, stream, logits, labels, rows, classes,
                 grad_scale, dlogits, scratch);
    } else {
      DDP_LAUNCH(xent_rows_kernel<0>, grid, block, stream, logits, labels, rows, classes,
                 grad_scale, dlogits, scratch);
    }
  }
  const int blocks = xent_total_blocks(rows);
  DDP_LAUNCH(xent_reduce_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kXentReduceThreads),
             stream, scratch, labels, rows, accumulate, totals,
             blocks > 1 ? scratch.partials : nullptr);
  if (blocks > 1) {
    DDP_LAUNCH(xent_finish_kernel, dim3(1), dim3(kXentReduceThreads), stream, scratch.partials,
               blocks, labels, accumulate, totals);
  }
}

// ---------------------------------------------------------------------------------------------
// L2 norm and clip_grad_norm_'s factor (Backend::l2_norm, Backend::clip_grad_norm_deferred), in
// two passes whose order of additions depends on n alone (not on the device, its SM count or
// the view's alignment), so a norm is the same bits on every run and every GPU:
//   1. norm_partials_kernel: norm_blocks(n) blocks; global thread g sums the squares (in double,
//      where a float's square is exact) of quads g, g + T, g + 2T, ... (T threads in the grid),
//      each quad's four elements in order; thread 0 then adds the last n % 4 elements. A fixed
//      tree in shared memory leaves one partial sum per block.
//   2. norm_finish_kernel: one block of 32 threads adds the partials (thread t: partials t,
//      t + 32, ... in order, then a fixed tree), takes the square root and forms the clip factor
//      in float32 exactly as clip_coefficient (backend.h) does, with correctly rounded
//      intrinsics.
// (Trees in shared memory rather than warp shuffles: about as fast on a device for a pass this
// size, and several times cheaper in the CPU emulation, where a shuffle is a 32-thread meeting.)

// A grid of at most 2048 x 128 threads (about what an H200's 132 SMs hold at once), each with at
// least 8 quads to sum (a few loads in flight per thread; past 2^23 values every thread sums
// more); the cap is fixed, not the device's SM count, so the order is n's alone. Blocks of 128
// rather than 256: the same on a device, half the cost of a small norm in the emulation.
constexpr int kNormThreads = 128;
constexpr int kNormMaxBlocks = 2048;
constexpr int64_t kNormMinPerThread = 32;
constexpr int kNormFinishThreads = 32;

/// Blocks of the first pass over n values: a pure function of n, between 1 and kNormMaxBlocks.
inline int norm_blocks(int64_t n) {
  const int64_t want = ceil_div(n, int64_t{kNormThreads} * kNormMinPerThread);
  return static_cast<int>(want < 1 ? 1 : want > kNormMaxBlocks ? kNormMaxBlocks : want);
}

__device__ __forceinline__ double square_in_double(float x) {
  const double d = x;
  return d * d;  // exact: 24 significant bits squared fit in 53
}

/// Pass 1: partials[blockIdx.x] = this block's sum of squares of x[0, n). `vec`: x is 16-byte
/// aligned, so a quad is one float4 load (the order of additions is the same either way).
__global__ void norm_partials_kernel(const float* __restrict__ x, int64_t n, bool vec,
                                     double* __restrict__ partials) {
  __shared__ double partial_sums[kNormThreads];
  DDP_EMU_SHARED(partial_sums);
  const int64_t threads = static_cast<int64_t>(gridDim.x) * kNormThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kNormThreads + threadIdx.x;
  const int64_t quads = n / 4;
  double sum = 0.0;
  for (int64_t q = first; q < quads; q += threads) {
    const float* p = x + 4 * q;
    float4 v;
    if (vec) {
      v = *reinterpret_cast<const float4*>(p);
    } else {
      v = make_float4(p[0], p[1], p[2], p[3]);
    }
    sum += square_in_double(v.x);
    sum += square_in_double(v.y);
    sum += square_in_double(v.z);
    sum += square_in_double(v.w);
  }
  if (first == 0) {
    for (int64_t i = 4 * quads; i < n; ++i) sum += square_in_double(x[i]);
  }
  const double total = block_sum_fixed<kNormThreads>(sum, partial_sums);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

/// Pass 2, one block of kNormFinishThreads: out->norm = sqrt(sum of partials[0, count));
/// out->coef = clip_coefficient(norm, max_norm) in float32 when clip and that is below 1, else
/// 1 (NaN too: no clipping, as the CPU backend does).
__global__ void norm_finish_kernel(const double* __restrict__ partials, int count, bool clip,
                                   float max_norm, NormResult* out) {
  __shared__ double finish_sums[kNormFinishThreads];
  DDP_EMU_SHARED(finish_sums);
  const int t = static_cast<int>(threadIdx.x);
  double sum = 0.0;
  for (int i = t; i < count; i += kNormFinishThreads) sum += partials[i];
  const double total = block_sum_fixed<kNormFinishThreads>(sum, finish_sums);
  if (t != 0) return;
  const double norm = sqrt(total);
  float coef = 1.0f;
  if (clip) {
    // torch 1.13: max_norm / (total_norm + 1e-6) in float32 is reciprocal(total_norm + 1e-6)
    // * max_norm; each step rounded on its own (no contraction), as clip_coefficient.
    const float shifted = __fadd_rn(__double2float_rn(norm), 1e-6f);
    const float factor = __fmul_rn(__fdiv_rn(1.0f, shifted), max_norm);
    if (factor < 1.0f) coef = factor;
  }
  out->norm = norm;
  out->coef = coef;
}

/// Queues both passes over x[0, n) (`vec`: x 16-byte aligned); `partials` holds kNormMaxBlocks
/// doubles of scratch; `out` (device memory) holds the result when the stream gets there. With
/// clip, out->coef is the factor for max_norm (as float, like clip_coefficient takes it).
inline void launch_l2_norm(const float* x, int64_t n, bool vec, double* partials, bool clip,
                           float max_norm, NormResult* out, cudaStream_t stream) {
  const int blocks = norm_blocks(n);
  DDP_LAUNCH(norm_partials_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kNormThreads), stream,
             x, n, vec, partials);
  DDP_LAUNCH(norm_finish_kernel, dim3(1), dim3(kNormFinishThreads), stream, partials, blocks, clip,
             max_norm, out);
}

}  // namespace cuda
}  // namespace ddp
