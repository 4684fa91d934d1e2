// One rank's replica of the model: its layers, the flat arenas its parameters and gradients
// live in (one offset per parameter, from the bucket plan), the Reducer that averages the
// gradients across ranks bucket by bucket, and the optimizer. Every rank builds the same one;
// rank 0's parameters are the ones every replica starts from. With
// distributed.shard_optimizer the optimizer updates (and keeps state for) this rank's parts of
// the buckets only, the Reducer reduce-scatters, and allgather_parameters() hands every rank
// the others' parts (on one node the parameter arena is one copy in shared memory).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ddp/config.h"
#include "ddp/safetensors.h"
#include "comm/gradient_communicator.h"
#include "comm/process_group.h"
#include "comm/reducer.h"
#include "comm/shard_plan.h"
#include "nn/optimizer.h"
#include "nn/sequential.h"
#include "train/device_context.h"
#include "train/fused_shard_update.h"

namespace ddp {

class Replica {
 public:
  /// The layers (room for batches of max_batch rows) and the bucket plan (sharded on a GPU:
  /// buckets padded to `world` equal parts); no collective. The replica keeps `ctx`.
  Replica(const TrainConfig& cfg, DeviceContext& ctx, int64_t max_batch, int world);

  /// Collective over `group`: the gradient communicator (`host_gradients` itself, or NCCL /
  /// staged on GPUs), its gradient arena (the parameters' gradients become views into the
  /// buckets) and, sharded, its parameter arena; rank 0's initial parameters on every rank
  /// (model.init_from or the seed), the Reducer and the optimizer.
  void connect(ProcessGroup& group, GradientCommunicator& host_gradients, const TrainConfig& cfg);

  Sequential& model() { return *model_; }
  const BucketPlan& plan() const { return plan_; }
  Reducer& reducer() { return *reducer_; }
  Optimizer& optimizer() { return *optimizer_; }
  /// distributed.shard_optimizer: the optimizer updates this rank's parts of the buckets.
  bool sharded() const { return sharded_; }
  /// distributed.overlap_optimizer where it applies (sharded CPU ranks, no clipping, no
  /// skip_step): the Reducer's reduce-scatters update the parameters during backward.
  bool fused() const { return fused_ != nullptr; }
  FusedShardUpdate& fused_update() { return *fused_; }
  /// distributed.hierarchical as resolved for this job (connect).
  bool hierarchical() const { return hierarchical_; }
  const ShardPlan& shards() const { return shards_; }
  /// Sharded: starts the allgather that gives every rank the parts the others updated, with
  /// `riders` (see GradientCommunicator::allgather_async, which every sharded step must call).
  std::shared_ptr<Work> allgather_parameters(ScalarRiders riders = {});
  /// The communicator the buckets travel on (the host one, or NCCL / staged on GPUs).
  GradientCommunicator& gradient_comm() {
    return device_gradients_ ? *device_gradients_ : *host_gradients_;
  }

  /// The flat arenas, as 1 x numel tensors on the device.
  Tensor parameters();
  Tensor gradients();
  /// Room for the loss gradient of a batch of `rows` rows.
  Tensor dlogits(int64_t rows);

  /// The parameters / one of the optimizer's state arrays in host memory, arena-shaped. A
  /// sharded optimizer's state is gathered from every rank: then a collective.
  std::vector<float> host_parameters();
  std::vector<float> host_optimizer_state(const std::string& name);
  /// The parameters' slices of an arena-shaped array, as named tensors.
  std::vector<NamedTensor> named(const std::vector<float>& arena) const;
  /// Names, and names with shapes, in registration order.
  std::vector<std::string> parameter_names() const { return model_->parameter_names(); }
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes() const;
  /// Places named tensors (from a checkpoint) into an arena-shaped array; every name must be
  /// one of the model's.
  void place(const std::vector<NamedTensor>& tensors, std::vector<float>& arena) const;
  /// Collective. Continues from a checkpoint: parameters and the optimizer's state arrays (in
  /// the order of its state_names()), all arena-shaped, and the updates taken.
  void restore(const std::vector<float>& parameters,
               const std::vector<std::vector<float>>& optimizer_state, int64_t optimizer_steps);

 private:
  void init_parameters(Sequential& target) const;
  void configure_gradient_path(const ProcessGroup& group, const TrainConfig& cfg);
  void fuse_update(const TrainConfig& cfg);
  void broadcast_parameters(ProcessGroup& comm);
  /// Collective: the parameters from arena-shaped host memory (sharded: each rank writes its
  /// parts, then the allgather).
  void write_parameters(const std::vector<float>& host);

  const TrainConfig& cfg_;
  DeviceContext& ctx_;
  std::unique_ptr<Sequential> model_;
  BucketPlan plan_;
  bool sharded_ = false;
  bool hierarchical_ = false;
  ShardPlan shards_;
  Buffer values_, dlogits_;  // values_: the parameter arena unless the communicator has it
  float* params_ = nullptr;  // the parameter arena
  GradientCommunicator* host_gradients_ = nullptr;
  // NCCL or staged; declared before what holds its collectives.
  std::unique_ptr<GradientCommunicator> device_gradients_;
  float* grads_ = nullptr;  // the gradient arena, owned by the gradient communicator
  std::unique_ptr<Reducer> reducer_;
  std::shared_ptr<Optimizer> optimizer_;  // shared with fused_, whose calls may outlive this
  std::shared_ptr<FusedShardUpdate> fused_;
};

}  // namespace ddp
