// The shard plan (shard_plan.h).
#include "comm/shard_plan.h"

#include <algorithm>

#include "core/check.h"

namespace ddp {

Span shard_part(size_t numel, int world, int rank) {
  DDP_CHECK(world >= 1 && rank >= 0 && rank < world,
            "shard_part: rank " << rank << " of " << world);
  const size_t n = static_cast<size_t>(world);
  const size_t share = (numel + n - 1) / n;
  const size_t chunk = (share + kShardAlign - 1) / kShardAlign * kShardAlign;
  const size_t lo = std::min(numel, static_cast<size_t>(rank) * chunk);
  return Span{lo, std::min(numel, lo + chunk) - lo};
}

ShardPlan compute_shard_plan(const BucketPlan& plan, int world, int rank) {
  ShardPlan shards;
  shards.world = world;
  shards.rank = rank;
  for (const BucketPlan::Bucket& b : plan.buckets) {
    shards.buckets.push_back(Span{b.offset, b.numel});
    const Span part = shard_part(b.numel, world, rank);
    if (part.numel == 0) continue;
    shards.owned.push_back(Span{b.offset + part.offset, part.numel});
    shards.owned_numel += part.numel;
  }
  std::sort(shards.owned.begin(), shards.owned.end(),
            [](const Span& a, const Span& b) { return a.offset < b.offset; });
  return shards;
}

BucketPlan pad_buckets_to_equal_parts(BucketPlan plan, int world) {
  DDP_CHECK(world >= 1, "pad_buckets_to_equal_parts: " << world << " ranks");
  const size_t multiple = static_cast<size_t>(world) * kShardAlign;
  size_t shift = 0;
  for (BucketPlan::Bucket& b : plan.buckets) {
    b.offset += shift;
    for (size_t p : b.params) plan.param_offset[p] += shift;
    const size_t padded = (b.numel + multiple - 1) / multiple * multiple;
    shift += padded - b.numel;
    b.numel = padded;
  }
  plan.total_numel += shift;
  return plan;
}

}  // namespace ddp
