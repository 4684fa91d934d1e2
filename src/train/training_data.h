// What a rank trains and evaluates on: both splits in memory, the sampler that gives this rank
// its shard of every epoch's global order, and the loaders that assemble batches ahead.
#pragma once

#include <cstdint>
#include <memory>

#include "data/dataset.h"
#include "data/loader.h"
#include "data/normalize.h"
#include "data/sampler.h"
#include "ddp/config.h"

namespace ddp {

/// Rows of an evaluation batch.
constexpr int64_t kEvalBatch = 1024;

struct TrainingData {
  Dataset train, test;
  bool has_test = false;
  FeatureTransform transform;  ///< data.normalize, applied to both splits (model metadata)
  std::unique_ptr<DistributedSampler> sampler;
  std::unique_ptr<Loader> train_loader, test_loader;

  /// Reads both splits (checked against the model's input and class counts), normalises them
  /// (data.normalize, fitted on the training split) and checks that every one of `world` ranks
  /// gets samples, and a whole batch when drop_last is set.
  void load(const TrainConfig& cfg, int world, int rank);
  /// The sampler and the loaders (after load()).
  void start(const TrainConfig& cfg, int world, int rank);
  /// Optimizer steps in a whole epoch of this rank (after start()).
  int64_t steps_per_epoch(const TrainConfig& cfg) const;
  /// The largest batch any pass computes on.
  int64_t max_batch(const TrainConfig& cfg) const;
};

}  // namespace ddp
