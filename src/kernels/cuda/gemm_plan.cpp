// The GEMM plan: which tile shape and how many K slices for a product of a given shape on a
// device with a given number of multiprocessors. Pure and host-only, so it is built (and
// tested) with or without CUDA.
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
}  // namespace

GemmPlan plan_gemm(int64_t m, int64_t n, int64_t k, int sm_count, bool vectorizable) {
  GemmPlan plan;
  plan.vectorized = vectorizable;
  const int64_t sms = sm_count > 0 ? sm_count : 1;
  // The largest tile that still gives every multiprocessor a block: big tiles reuse each
  // loaded element the most.
  for (int tile = 0; tile < 3; ++tile) {
    if (blocks_for(m, n, tile) >= sms) {
      plan.tile = tile;
      return plan;
    }
  }
  // Too few output tiles to fill the device: 64x64 tiles if they fill half of it, else 32x32,
  // and split K so that tiles x slices covers the multiprocessors.
  plan.tile = blocks_for(m, n, 1) * 2 >= sms ? 1 : 2;
  const int64_t blocks = blocks_for(m, n, plan.tile);
  int64_t splits = sms / blocks;
  if (splits > k / kMinSliceK) splits = k / kMinSliceK;
  if (splits > kMaxSplits) splits = kMaxSplits;
  plan.splits = splits > 1 ? static_cast<int>(splits) : 1;
  return plan;
}

}  // namespace ddp
