// The shard plan of distributed.shard_optimizer (ZeRO stage 1): which part of the flat parameter
// arena each rank updates. Every bucket is cut into one contiguous part per rank, in rank order,
// so each rank reduces (reduce-scatter), updates (its optimizer state covers only its parts) and
// contributes (allgather) an equal share of every bucket, and a bucket's reduce-scatter starts
// during backward like its allreduce did. A pure function of the bucket plan and the world size,
// identical on every rank, like the bucket plan.
#pragma once

#include <cstddef>
#include <vector>

#include "core/tensor.h"
#include "comm/reducer.h"

namespace ddp {

/// Parts start on multiples of this many floats (64 bytes: one cache line, so two ranks never
/// write one line; also a GPU's 16-byte vector access).
constexpr size_t kShardAlign = 16;

/// Rank `rank`'s part of a bucket of `numel` floats among `world` ranks, relative to the
/// bucket's start: ceil(numel / world) rounded up to kShardAlign floats per rank, the last parts
/// shorter or empty.
Span shard_part(size_t numel, int world, int rank);

struct ShardPlan {
  int world = 1;
  int rank = 0;
  std::vector<Span> buckets;  ///< every bucket of the plan, in bucket order
  std::vector<Span> owned;    ///< this rank's non-empty part of each bucket, in arena order
  size_t owned_numel = 0;     ///< sum of owned
};

ShardPlan compute_shard_plan(const BucketPlan& plan, int world, int rank);

/// `plan` with every bucket grown (zeros at its end, later buckets moved up) to a multiple of
/// world x kShardAlign floats, so that every rank's part of it has the same size: what NCCL's
/// reduce-scatter and allgather need. Alignment of `plan` is kept.
BucketPlan pad_buckets_to_equal_parts(BucketPlan plan, int world);

}  // namespace ddp
