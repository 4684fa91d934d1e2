// DistributedSampler against hand-worked torch.utils.data.distributed.DistributedSampler cases
// (padding by wrapping, drop_last truncation, stride-world split), the shared seed + epoch
// shuffle, random_permutation's uniformity, and the unpadded evaluation shard.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "data/sampler.h"

using Catch::Contains;
using ddp::DistributedSampler;
using Indices = std::vector<int64_t>;

namespace {

std::vector<Indices> all_ranks(int64_t n, int world, bool shuffle, uint64_t seed, bool drop_last,
                               int64_t epoch) {
  std::vector<Indices> out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, world, r, shuffle, seed, drop_last);
    s.set_epoch(epoch);
    out.push_back(s.indices());
    REQUIRE(static_cast<int64_t>(out.back().size()) == s.num_samples());
    REQUIRE(s.total_size() == s.num_samples() * world);
  }
  return out;
}

/// The global order the ranks' stride-world slices came from.
Indices interleave(const std::vector<Indices>& per_rank) {
  Indices out;
  for (size_t k = 0; k < per_rank[0].size(); ++k)
    for (const auto& r : per_rank) out.push_back(r[k]);
  return out;
}

Indices iota_n(int64_t n) {
  Indices v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

}  // namespace

TEST_CASE("sampler splits a divisible dataset into disjoint covering shards", "[data][sampler]") {
  for (bool shuffle : {false, true}) {
    const auto ranks = all_ranks(12, 4, shuffle, 5, false, 0);
    Indices all;
    for (const auto& r : ranks) {
      REQUIRE(r.size() == 3);
      all.insert(all.end(), r.begin(), r.end());
    }
    std::sort(all.begin(), all.end());
    REQUIRE(all == iota_n(12));  // disjoint (no repeats) and covering
  }
  REQUIRE(all_ranks(12, 4, false, 5, false, 0)[1] == Indices{1, 5, 9});
  REQUIRE(all_ranks(12, 4, false, 5, true, 0)[1] == Indices{1, 5, 9});  // drop_last changes nothing
}

TEST_CASE("sampler pads a non-divisible dataset by wrapping, like torch", "[data][sampler]") {
  SECTION("n=10 world=4") {
    // torch: num_samples = ceil(10/4) = 3, total 12, order 0..9 then 0,1.
    const auto ranks = all_ranks(10, 4, false, 0, false, 0);
    REQUIRE(ranks == std::vector<Indices>{{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}});
    DistributedSampler s(10, 4, 0, false, 0, false);
    REQUIRE(s.num_samples() == 3);
    REQUIRE(s.total_size() == 12);
  }
  SECTION("padding longer than the dataset wraps repeatedly (n=2 world=5)") {
    const auto ranks = all_ranks(2, 5, false, 0, false, 0);
    REQUIRE(ranks == std::vector<Indices>{{0}, {1}, {0}, {1}, {0}});
  }
  SECTION("n=3 world=8: one sample per rank, the order wraps twice") {
    const auto ranks = all_ranks(3, 8, false, 0, false, 0);
    REQUIRE(interleave(ranks) == Indices{0, 1, 2, 0, 1, 2, 0, 1});
  }
  SECTION("shuffled padding repeats the head of the same permutation") {
    const auto ranks = all_ranks(7, 3, true, 11, false, 2);
    const Indices order = interleave(ranks);
    const Indices perm = ddp::random_permutation(7, 13);
    REQUIRE(order.size() == 9);
    REQUIRE(Indices(order.begin(), order.begin() + 7) == perm);
    REQUIRE(order[7] == perm[0]);
    REQUIRE(order[8] == perm[1]);
  }
}

TEST_CASE("sampler drop_last truncates to a multiple of the world size", "[data][sampler]") {
  SECTION("n=10 world=4") {
    const auto ranks = all_ranks(10, 4, false, 0, true, 0);
    REQUIRE(ranks == std::vector<Indices>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  }
  SECTION("n=2 world=5 leaves nothing") {
    for (const auto& r : all_ranks(2, 5, false, 0, true, 0)) REQUIRE(r.empty());
  }
  SECTION("shuffled: the head of the permutation, no duplicates") {
    const auto ranks = all_ranks(11, 3, true, 4, true, 1);
    const Indices perm = ddp::random_permutation(11, 5);
    REQUIRE(interleave(ranks) == Indices(perm.begin(), perm.begin() + 9));
  }
}

TEST_CASE("sampler shuffle: one permutation per epoch, shared by all ranks", "[data][sampler]") {
  const int64_t n = 40;
  const auto e0 = all_ranks(n, 4, true, 99, false, 0);
  const auto e0_again = all_ranks(n, 4, true, 99, false, 0);
  const auto e1 = all_ranks(n, 4, true, 99, false, 1);
  REQUIRE(e0 == e0_again);  // separate sampler objects agree
  REQUIRE(e0 != e1);        // reshuffled each epoch
  REQUIRE(all_ranks(n, 4, true, 100, false, 0) != e0);
  REQUIRE(all_ranks(n, 4, true, 98, false, 1) == e0);  // the stream is seeded by seed + epoch

  // The ranks' slices interleave back into one permutation of 0..n-1: they agree on it.
  const Indices order = interleave(e1);
  REQUIRE(order == ddp::random_permutation(n, 100));
  Indices sorted = order;
  std::sort(sorted.begin(), sorted.end());
  REQUIRE(sorted == iota_n(n));
  REQUIRE(order != iota_n(n));

  // set_epoch on one object moves between epochs and back.
  DistributedSampler s(n, 4, 2, true, 99, false);
  s.set_epoch(1);
  REQUIRE(s.indices() == e1[2]);
  s.set_epoch(0);
  REQUIRE(s.indices() == e0[2]);
}

TEST_CASE("random_permutation is a uniform shuffle", "[data][sampler]") {
  REQUIRE(ddp::random_permutation(0, 1).empty());
  REQUIRE(ddp::random_permutation(1, 1) == Indices{0});
  // All 6 orders of 3 items, each ~1/6 of the time (a biased shuffle such as swapping with
  // below(n) instead of below(i + 1) gives 4/27 vs 5/27 and fails this).
  std::map<Indices, int> counts;
  const int trials = 60000;
  for (int t = 0; t < trials; ++t) ++counts[ddp::random_permutation(3, static_cast<uint64_t>(t))];
  REQUIRE(counts.size() == 6);
  for (const auto& kv : counts) REQUIRE(std::abs(kv.second - trials / 6) < 500);  // ~5 sigma
  REQUIRE_THROWS_WITH(ddp::random_permutation(-1, 0), Contains("n must be non-negative, got -1"));
}

TEST_CASE("sampler rejects bad arguments", "[data][sampler]") {
  REQUIRE_THROWS_WITH(DistributedSampler(0, 2, 0, true, 0, false),
                      Contains("dataset size must be positive, got 0"));
  REQUIRE_THROWS_WITH(DistributedSampler(10, 0, 0, true, 0, false),
                      Contains("world size must be positive, got 0"));
  REQUIRE_THROWS_WITH(DistributedSampler(10, 2, 2, true, 0, false),
                      Contains("rank 2 is outside [0, 2)"));
  REQUIRE_THROWS_WITH(DistributedSampler(10, 2, -1, true, 0, false),
                      Contains("rank -1 is outside [0, 2)"));
  DistributedSampler s(10, 2, 0, true, 0, false);
  REQUIRE_THROWS_WITH(s.set_epoch(-1), Contains("epoch must be non-negative, got -1"));
  REQUIRE_THROWS_WITH(s.set_epoch(0, 10), Contains("start 10 is outside [0, 10)"));
  REQUIRE_THROWS_WITH(s.set_epoch(0, -1), Contains("start -1 is outside [0, 10)"));
}

TEST_CASE("sampler resumed mid-epoch: the same world continues the epoch exactly",
          "[data][sampler]") {
  for (bool drop_last : {false, true}) {
    for (int world : {1, 2, 3, 4}) {
      const int64_t n = 23;
      const auto whole = all_ranks(n, world, true, 7, drop_last, 5);
      // A checkpoint after k batches of one sample per rank consumed k * world positions.
      for (int64_t k = 0; k * world < n && k < static_cast<int64_t>(whole[0].size()); ++k) {
        for (int r = 0; r < world; ++r) {
          INFO("drop_last " << drop_last << " world " << world << " k " << k << " rank " << r);
          DistributedSampler s(n, world, r, true, 7, drop_last);
          s.set_epoch(5, k * world);
          CHECK(s.start() == k * world);
          CHECK(s.indices() == Indices(whole[r].begin() + k, whole[r].end()));
        }
      }
    }
  }
}

TEST_CASE("sampler resumed on another world size covers the rest of the epoch",
          "[data][sampler]") {
  const int64_t n = 23, start = 8;  // e.g. 2 ranks x 4 samples consumed
  DistributedSampler whole(n, 1, 0, true, 3, false);
  whole.set_epoch(2);
  const Indices order = whole.indices();
  for (int world : {1, 3, 4}) {
    std::vector<Indices> per_rank;
    for (int r = 0; r < world; ++r) {
      DistributedSampler s(n, world, r, true, 3, false);
      s.set_epoch(2, start);
      per_rank.push_back(s.indices());
      CHECK(s.num_samples() == (n - start + world - 1) / world);
    }
    const Indices got = interleave(per_rank);
    INFO("world " << world);
    // The remaining positions in order, then padding that wraps to the epoch's beginning.
    REQUIRE(got.size() >= static_cast<size_t>(n - start));
    CHECK(Indices(got.begin(), got.begin() + (n - start)) ==
          Indices(order.begin() + start, order.end()));
    for (size_t i = n - start; i < got.size(); ++i) CHECK(got[i] == order[i - (n - start)]);
  }
}

TEST_CASE("shard_indices splits evaluation data without padding", "[data][sampler]") {
  REQUIRE(ddp::shard_indices(10, 4, 0) == Indices{0, 4, 8});
  REQUIRE(ddp::shard_indices(10, 4, 1) == Indices{1, 5, 9});
  REQUIRE(ddp::shard_indices(10, 4, 2) == Indices{2, 6});
  REQUIRE(ddp::shard_indices(10, 4, 3) == Indices{3, 7});
  REQUIRE(ddp::shard_indices(2, 5, 1) == Indices{1});
  REQUIRE(ddp::shard_indices(2, 5, 3).empty());
  REQUIRE(ddp::shard_indices(0, 3, 0).empty());
  REQUIRE(ddp::shard_indices(5, 1, 0) == iota_n(5));
  REQUIRE_THROWS_WITH(ddp::shard_indices(-1, 2, 0), Contains("n must be non-negative"));
  REQUIRE_THROWS_WITH(ddp::shard_indices(5, 0, 0), Contains("world size must be positive"));
  REQUIRE_THROWS_WITH(ddp::shard_indices(5, 2, 2), Contains("rank 2 is outside [0, 2)"));
}
