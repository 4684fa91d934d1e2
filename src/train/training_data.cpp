// The training and test data of one rank (training_data.h).
#include "train/training_data.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace ddp {

void TrainingData::load(const TrainConfig& cfg, int world, int rank) {
  const int64_t features = cfg.model.layers.front();
  const int64_t classes = cfg.model.layers.back();
  train = load_split(cfg.data, cfg.data.train, false, features, classes);
  has_test = cfg.data.test.configured();
  if (has_test) test = load_split(cfg.data, cfg.data.test, true, features, classes);
  transform = fit_normalization(cfg.data.normalize, train);
  apply_normalization(transform, train);
  if (has_test) apply_normalization(transform, test);
  DistributedSampler probe(train.size, world, rank, false, 0, cfg.data.drop_last);
  DDP_CHECK(probe.num_samples() >= 1, "data.train: " << train.source << " has " << train.size
                                                     << " samples, fewer than the " << world
                                                     << " ranks");
  DDP_CHECK(!cfg.data.drop_last || probe.num_samples() >= cfg.training.batch_size,
            "training.batch_size: " << cfg.training.batch_size
                                    << " is larger than a rank's shard of " << probe.num_samples()
                                    << " samples and data.drop_last is set: "
                                    << "no batch would be left");
}

void TrainingData::start(const TrainConfig& cfg, int world, int rank) {
  sampler = std::make_unique<DistributedSampler>(train.size, world, rank, cfg.data.shuffle,
                                                 cfg.training.seed, cfg.data.drop_last);
  train_loader = std::make_unique<Loader>(train, cfg.training.batch_size, cfg.data.drop_last,
                                          cfg.data.prefetch);
  if (has_test) test_loader = std::make_unique<Loader>(test, kEvalBatch, false, cfg.data.prefetch);
}

int64_t TrainingData::steps_per_epoch(const TrainConfig& cfg) const {
  const int64_t n = sampler->num_samples(), b = cfg.training.batch_size;
  const int64_t batches = cfg.data.drop_last ? n / b : (n + b - 1) / b;
  const int64_t a = cfg.training.accumulate_steps;
  return (batches + a - 1) / a;
}

int64_t TrainingData::max_batch(const TrainConfig& cfg) const {
  return std::max<int64_t>(cfg.training.batch_size, has_test ? kEvalBatch : 1);
}

}  // namespace ddp
