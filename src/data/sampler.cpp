// DistributedSampler with torch's arithmetic, and the unpadded evaluation shard. Every rank
// computes the same global order from (seed + epoch) and takes a stride-world slice of it.
#include "data/sampler.h"

#include <numeric>
#include <utility>

#include "core/check.h"
#include "core/random.h"

namespace ddp {

namespace {

void check_rank(int world, int rank, const char* who) {
  DDP_CHECK(world > 0, who << ": world size must be positive, got " << world);
  DDP_CHECK(rank >= 0 && rank < world,
            who << ": rank " << rank << " is outside [0, " << world << ")");
}

}  // namespace

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed) {
  DDP_CHECK(n >= 0, "random_permutation: n must be non-negative, got " << n);
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int world, int rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : size_(dataset_size),
      world_(world),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  DDP_CHECK(dataset_size > 0,
            "DistributedSampler: dataset size must be positive, got " << dataset_size);
  check_rank(world, rank, "DistributedSampler");
  set_epoch(0);
}

void DistributedSampler::set_epoch(int64_t epoch, int64_t start) {
  DDP_CHECK(epoch >= 0, "DistributedSampler::set_epoch: epoch must be non-negative, got " << epoch);
  DDP_CHECK(start >= 0 && start < size_,
            "DistributedSampler::set_epoch: start " << start << " is outside [0, " << size_ << ")");
  epoch_ = epoch;
  start_ = start;
  // drop_last: floor(n / world) per rank (torch's ceil((n - world) / world)); else ceil(n / world).
  const int64_t n = size_ - start_;
  num_samples_ = drop_last_ ? n / world_ : (n + world_ - 1) / world_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = random_permutation(size_, seed_ + static_cast<uint64_t>(epoch_));
  } else {
    order.resize(static_cast<size_t>(size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  // Position k of the padded/truncated global order is order[k % n]: padding wraps from the
  // start as often as needed, truncation never reaches past n.
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t k = start_ + rank_; k < start_ + total_size(); k += world_)
    mine.push_back(order[static_cast<size_t>(k % size_)]);
  return mine;
}

std::vector<int64_t> shard_indices(int64_t n, int world, int rank) {
  DDP_CHECK(n >= 0, "shard_indices: n must be non-negative, got " << n);
  check_rank(world, rank, "shard_indices");
  std::vector<int64_t> mine;
  for (int64_t k = rank; k < n; k += world) mine.push_back(k);
  return mine;
}

}  // namespace ddp
