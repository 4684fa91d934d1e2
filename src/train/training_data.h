// What a rank trains and evaluates on: both splits (in their stored type; with
// data.share_on_node one copy per node, mapped by every rank of it), the sampler that gives this
// rank its shard of every epoch's global order, and the loaders that assemble batches ahead.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/normalize.h"
#include "data/sampler.h"
#include "ddp/config.h"

namespace ddp {

/// Rows of an evaluation batch.
constexpr int64_t kEvalBatch = 1024;

/// The loader threads of a rank (data.workers; 0: 1 on a CPU rank, whose core computes; on a
/// GPU rank the node's cores shared by its `local_size` ranks, at most 4).
int loader_workers(const TrainConfig& cfg, Device device, int local_size);

class TrainingData {
 public:
  Dataset train, test;
  bool has_test = false;
  FeatureTransform transform;  ///< data.normalize, applied to both splits (model metadata)
  std::unique_ptr<DistributedSampler> sampler;
  std::unique_ptr<Loader> train_loader, test_loader;

  /// Reads both splits, checked against the model's input and class counts: on every rank, or
  /// with data.share_on_node and more than one rank on the node, on its first rank only. Not
  /// collective.
  void read(const TrainConfig& cfg, const ProcessGroup& comm);
  /// Collective, after read(): with data.share_on_node, every rank of a node views one copy of
  /// each split that the node's first rank wrote (on every node alike, one of a single rank
  /// too, when any node has more); where that cannot be, every rank reads its own. .npy features need neither: every rank maps the files, whose pages the node's page
  /// cache holds once. Returns the log line that says which.
  std::string share(const TrainConfig& cfg, ProcessGroup& comm);
  /// Normalises both splits (data.normalize, fitted on the training split) and checks that
  /// every one of `world` ranks gets samples, and a whole batch when drop_last is set.
  void prepare(const TrainConfig& cfg, int world, int rank);
  /// What the ranks compare to know they read the same data (after share()): each split's
  /// samples, features, stored type and a checksum of its labels. Not of the features: that
  /// would read all of data larger than memory.
  std::vector<std::string> fingerprint() const;
  /// The sampler and the loaders (after prepare()).
  void start(const TrainConfig& cfg, int world, int rank, int workers);
  /// Optimizer steps in a whole epoch of this rank (after start()).
  int64_t steps_per_epoch(const TrainConfig& cfg) const;
  /// The largest batch any pass computes on.
  int64_t max_batch(const TrainConfig& cfg) const;

 private:
  bool shares(const TrainConfig& cfg, const ProcessGroup& comm) const;
  void read_splits(const TrainConfig& cfg);
};

}  // namespace ddp
