// Which samples each rank sees per epoch. Mirrors torch.utils.data.distributed.DistributedSampler
// (seed + epoch shuffle shared by all ranks, pad by wrapping or drop the tail, stride-world
// split), so every rank gets the same number of samples and the ranks together cover the epoch.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp {

/// A uniformly random permutation of 0..n-1 (Fisher-Yates from the top, j = Rng(seed).below(i+1)).
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed);

class DistributedSampler {
 public:
  /// dataset_size > 0, world > 0, 0 <= rank < world; throws ddp::Error otherwise.
  DistributedSampler(int64_t dataset_size, int world, int rank, bool shuffle, uint64_t seed,
                     bool drop_last);

  /// Selects the epoch whose order indices() returns; all ranks must use the same epoch.
  /// `start` > 0 resumes the epoch after its first `start` positions of the global order (what
  /// the ranks of a checkpointed run consumed, over any world size): the remaining
  /// dataset_size - start positions are padded or dropped and split over this world as a
  /// whole epoch would be, so with the same world the indices are exactly the tail of the
  /// uninterrupted epoch's. 0 <= start < dataset_size.
  void set_epoch(int64_t epoch, int64_t start = 0);
  /// This rank's indices for the current epoch (from its start): num_samples() of them.
  std::vector<int64_t> indices() const;
  /// Samples per rank in the current epoch (from its start).
  int64_t num_samples() const { return num_samples_; }
  /// Samples over all ranks (num_samples() * world), padding included.
  int64_t total_size() const { return num_samples_ * world_; }
  /// Position in the epoch's global order where indices() begins.
  int64_t start() const { return start_; }

 private:
  int64_t size_;
  int world_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t start_ = 0;
  int64_t num_samples_;
};

/// Evaluation shard without padding or duplication: rank, rank + world, ... < n (ranks may
/// differ by one sample). Throws ddp::Error for n < 0, world <= 0 or rank outside [0, world).
std::vector<int64_t> shard_indices(int64_t n, int world, int rank);

}  // namespace ddp
