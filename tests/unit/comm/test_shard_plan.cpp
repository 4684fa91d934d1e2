// The shard plan of the sharded optimizer (a pure function): each bucket cut into one part per
// rank, in rank order, aligned, balanced, together exactly the bucket; a rank's owned parts.
#include <catch2/catch.hpp>
#include <vector>

#include "core/check.h"
#include "comm/shard_plan.h"

using ddp::shard_part;
using ddp::Span;

TEST_CASE("shard parts tile a bucket in rank order, aligned and balanced", "[shard]") {
  for (size_t numel : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{33}, size_t{1000},
                       size_t{4099}, size_t{200714}}) {
    for (int world : {1, 2, 3, 4, 7, 64}) {
      INFO(numel << " floats over " << world << " ranks");
      size_t next = 0, largest = 0;
      for (int r = 0; r < world; ++r) {
        const Span part = shard_part(numel, world, r);
        REQUIRE(part.offset == next);  // contiguous, in rank order
        if (part.numel > 0) REQUIRE(part.offset % ddp::kShardAlign == 0);
        next = part.end();
        largest = std::max(largest, part.numel);
      }
      REQUIRE(next == numel);
      // No part is more than one alignment unit above the fair share.
      REQUIRE(largest <= (numel + world - 1) / world + ddp::kShardAlign - 1);
    }
  }
  REQUIRE(shard_part(1000, 4, 0) == Span{0, 256});
  REQUIRE(shard_part(1000, 4, 3) == Span{768, 232});
  REQUIRE(shard_part(33, 4, 2) == Span{32, 1});
  REQUIRE(shard_part(33, 4, 3) == Span{33, 0});
  REQUIRE_THROWS_AS(shard_part(10, 2, 2), ddp::Error);
}

TEST_CASE("shard plan: a rank owns its part of every bucket; the ranks' parts cover each once",
          "[shard]") {
  const std::vector<size_t> numel = {784 * 256, 256, 256 * 10, 10};
  const ddp::BucketPlan plan = ddp::compute_bucket_plan(numel, 4096, 65536);
  REQUIRE(plan.buckets.size() >= 2);
  for (int world : {1, 2, 4}) {
    std::vector<int> covered(plan.total_numel, 0);
    size_t owned_total = 0;
    for (int r = 0; r < world; ++r) {
      const ddp::ShardPlan shards = ddp::compute_shard_plan(plan, world, r);
      REQUIRE(shards.buckets.size() == plan.buckets.size());
      size_t sum = 0, last_end = 0;
      for (const Span& s : shards.owned) {
        REQUIRE(s.numel > 0);
        REQUIRE(s.offset >= last_end);  // in arena order, disjoint
        last_end = s.end();
        sum += s.numel;
        for (size_t i = s.offset; i < s.end(); ++i) ++covered[i];
      }
      REQUIRE(sum == shards.owned_numel);
      owned_total += sum;
      // About 1/world of the arena: the optimizer state a rank keeps.
      REQUIRE(shards.owned_numel <= plan.total_numel / world + plan.buckets.size() * 16);
    }
    REQUIRE(owned_total == plan.total_numel);
    size_t wrong = 0;
    for (const auto& b : plan.buckets)
      for (size_t i = b.offset; i < b.offset + b.numel; ++i) wrong += covered[i] != 1;
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("buckets padded to equal parts: every rank's part the same size, tensors in place",
          "[shard]") {
  const std::vector<size_t> numel = {784 * 256, 256, 256 * 10, 10};
  const ddp::BucketPlan plan = ddp::compute_bucket_plan(numel, 4096, 65536, /*align=*/4);
  for (int world : {1, 2, 3, 4}) {
    INFO(world << " ranks");
    const ddp::BucketPlan padded = ddp::pad_buckets_to_equal_parts(plan, world);
    REQUIRE(padded.buckets.size() == plan.buckets.size());
    size_t grown = 0;
    for (size_t b = 0; b < padded.buckets.size(); ++b) {
      const auto& p = padded.buckets[b];
      const auto& o = plan.buckets[b];
      REQUIRE(p.params == o.params);
      REQUIRE(p.offset == o.offset + grown);  // moved up by the padding before it
      REQUIRE(p.numel % (world * ddp::kShardAlign) == 0);
      REQUIRE(p.numel >= o.numel);
      REQUIRE(p.numel - o.numel < world * ddp::kShardAlign);
      for (size_t q : p.params) REQUIRE(padded.param_offset[q] == plan.param_offset[q] + grown);
      for (int r = 0; r < world; ++r)
        REQUIRE(ddp::shard_part(p.numel, world, r) == Span{r * p.numel / world, p.numel / world});
      grown += p.numel - o.numel;
    }
    REQUIRE(padded.total_numel == plan.total_numel + grown);
    for (size_t q = 0; q < numel.size(); ++q) REQUIRE(padded.param_offset[q] % 4 == 0);
  }
}
