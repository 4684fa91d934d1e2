// The GEMM plan: which tile shape and how many K slices for a product of a given shape on a
// device with a given number of multiprocessors, so the grid is at least one wave (a block per
// multiprocessor) wherever the tiles and the slice limits allow one. Pure and host-only, so it is
// built (and tested) with or without CUDA.
#include "kernels/cuda/cuda.h"

namespace ddp {

namespace {
constexpr int kTileEdge[3] = {128, 64, 32};
// A K slice shorter than this costs more in its partial-sum traffic than it gains in blocks.
constexpr int64_t kMinSliceK = 256;
constexpr int kMaxSplits = 16;

int64_t blocks_for(int64_t m, int64_t n, int tile) {
  const int64_t e = kTileEdge[tile];
  return ((m + e - 1) / e) * ((n + e - 1) / e);
}

// The K slices launch_gemm makes when asked for `splits`: a slice is a multiple of 64 long
// (gemm.cuh: gemm_k_per_split), so a request may give fewer. Never fewer than 1; monotone in
// splits, and asking for the result again gives the result again.
int64_t slices_for(int64_t k, int64_t splits) {
  const int64_t per = (k + splits - 1) / splits;
  const int64_t slice = (per + 63) / 64 * 64;
  return slice > 0 ? (k + slice - 1) / slice : 1;
}
}  // namespace

GemmPlan plan_gemm(int64_t m, int64_t n, int64_t k, int sm_count, bool vectorizable) {
  GemmPlan plan;
  plan.vectorized = vectorizable;
  const int64_t sms = sm_count > 0 ? sm_count : 1;
  // The largest tile that still gives every multiprocessor a block (one wave): big tiles reuse
  // each loaded element the most.
  for (int tile = 0; tile < 3; ++tile) {
    if (blocks_for(m, n, tile) >= sms) {
      plan.tile = tile;
      return plan;
    }
  }
  // Too few output tiles even at 32x32, the tile with the most blocks: split K into the fewest
  // slices (each adds m x n partial sums to write and read back) that make a wave, counting
  // the slices the 64-long rounding really gives; where no split within the limits makes one,
  // the most slices.
  plan.tile = 2;
  const int64_t blocks = blocks_for(m, n, plan.tile);
  int64_t most = k / kMinSliceK;
  if (most > kMaxSplits) most = kMaxSplits;
  int64_t slices = 1;
  for (int64_t s = 2; s <= most && blocks * slices < sms; ++s) slices = slices_for(k, s);
  plan.splits = static_cast<int>(slices);
  return plan;
}

}  // namespace ddp
