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
#include <optional>
#include <string>
#include <vector>

#include "comm/gradient_communicator.h"
#include "comm/powersgd_communicator.h"
#include "comm/process_group.h"
#include "comm/reducer.h"
#include "comm/shard_plan.h"
#include "config/gradient_path.h"
#include "core/tensor.h"
#include "ddp/config.h"
#include "ddp/safetensors.h"
#include "nn/optimizer.h"
#include "nn/sequential.h"
#include "train/device_context.h"
#include "train/fused_shard_update.h"

namespace ddp {

/// The 16-bit operand format of training.precision; none for fp32.
std::optional<Half> mixed_format(Precision p);

/// What runs training.precision's GEMMs on `be`, for the startup log; throws ddp::Error naming
/// the key where the backend has no kernels for it.
std::string describe_precision(Precision p, Backend& be);

class Replica {
 public:
  /// The layers (room for batches of max_batch rows) and the bucket plan (with
  /// path.equal_parts: buckets padded to `world` equal parts); no collective. The replica keeps
  /// `ctx` and a copy of `path`.
  Replica(const TrainConfig& cfg, const GradientPath& path, DeviceContext& ctx, int64_t max_batch,
          int world);

  /// Collective over `group`: the gradient communicator (`host` itself, or NCCL / staged on
  /// GPUs), its gradient arena for the path's wire (the parameters' gradients become views into
  /// the buckets) and, sharded, its parameter arena; rank 0's initial parameters on every rank
  /// (model.init_from or the seed), the Reducer and the optimizer.
  void connect(ProcessGroup& group, HostGradientCommunicator& host, const TrainConfig& cfg);

  Sequential& model() { return *model_; }
  const Sequential& model() const { return *model_; }
  const BucketPlan& plan() const { return plan_; }
  Reducer& reducer() { return *reducer_; }
  /// The host's gradient communicator (after connect()): its lane also carries the exact sums
  /// of training.bitwise_across_world_sizes.
  HostGradientCommunicator& host() { return *host_; }
  /// distributed.compression powersgd: its communicator (state, step count); else null. After
  /// connect().
  PowerSgdCommunicator* powersgd() const { return powersgd_.get(); }
  /// The flight recorder the step stamps with its number (null: none); after connect().
  void set_flight_recorder(FlightRecorder* recorder) {
    flight_ = recorder;
    reducer_->set_flight_recorder(recorder);
    // A device communicator numbers its own collectives (the host's lane never sees them).
    if (auto* device = dynamic_cast<CapturableCommunicator*>(device_gradients_.get()))
      device->set_flight_recorder(recorder);
  }
  FlightRecorder* flight_recorder() const { return flight_; }
  Optimizer& optimizer() { return *optimizer_; }
  /// How gradients go from backward to the update in this job.
  const GradientPath& path() const { return path_; }
  /// The startup log's line on training.precision (describe_precision).
  const std::string& precision_line() const { return precision_line_; }
  /// path().sharded: the optimizer updates this rank's parts of the buckets.
  bool sharded() const { return path_.sharded; }
  /// path().fused_update: the Reducer's reduce-scatters update the parameters during backward.
  bool fused() const { return path_.fused_update; }
  FusedShardUpdate& fused_update() { return *fused_; }
  const ShardPlan& shards() const { return shards_; }
  /// The buckets' communicator where a graph may capture its collectives (NCCL, unsharded),
  /// else null.
  CapturableCommunicator* capturable() const {
    return path_.sharded ? nullptr : dynamic_cast<CapturableCommunicator*>(buckets_);
  }
  /// Sharded: starts the allgather that gives every rank the parts the others updated, with
  /// `riders` (host memory only: HostGradientCommunicator::allgather_with_riders; see
  /// ShardedCommunicator::allgather_async, which every sharded step must call).
  std::shared_ptr<Work> allgather_parameters(ScalarRiders riders = {});

  /// The flat arenas, as 1 x numel tensors on the device.
  Tensor parameters();
  Tensor gradients();
  /// Room for the loss gradient of a batch of `rows` rows.
  Tensor dlogits(int64_t rows);

  /// The parameters / one of the optimizer's state arrays in host memory, arena-shaped. A
  /// sharded optimizer's state is gathered from every rank: then a collective. The forms
  /// with `host` fill it, reusing its memory (a checkpoint's copy, taken again and again).
  std::vector<float> host_parameters();
  std::vector<float> host_optimizer_state(const std::string& name);
  void host_parameters(std::vector<float>& host);
  void host_optimizer_state(const std::string& name, std::vector<float>& host);
  /// The parameters' slices of an arena-shaped array, as named tensors (into `out`: its
  /// tensors' memory reused).
  std::vector<NamedTensor> named(const std::vector<float>& arena) const;
  void named(const std::vector<float>& arena, std::vector<NamedTensor>& out) const;
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
  void make_communicators(ProcessGroup& group, HostGradientCommunicator& host,
                          const DistributedConfig& cfg);
  std::unique_ptr<PowerSgdCommunicator> make_powersgd(HostGradientCommunicator& host,
                                                      GradientCommunicator& whole, int world) const;
  void fuse_update();
  void broadcast_parameters(ProcessGroup& comm);
  /// Collective: the parameters from arena-shaped host memory (sharded: each rank writes its
  /// parts, then the allgather).
  void write_parameters(const std::vector<float>& host);

  const TrainConfig& cfg_;
  DeviceContext& ctx_;
  std::unique_ptr<Sequential> model_;
  const GradientPath path_;
  std::string precision_line_;
  BucketPlan plan_;
  ShardPlan shards_;
  Buffer values_, dlogits_;  // values_: the parameter arena unless the communicator has it
  float* params_ = nullptr;  // the parameter arena
  HostGradientCommunicator* host_ = nullptr;
  // distributed.compression powersgd: in front of device_gradients_ or the host. Declared
  // first, so that a device communicator ends (drained or aborted) before the buffers its
  // stream may still use are freed.
  std::unique_ptr<PowerSgdCommunicator> powersgd_;
  // NCCL or staged; declared before what holds its collectives.
  std::unique_ptr<GradientCommunicator> device_gradients_;
  GradientCommunicator* buckets_ = nullptr;  // the buckets' communicator: host_ or the device's
  ShardedCommunicator* sharded_ = nullptr;   // sharded: the same one
  float* grads_ = nullptr;  // the gradient arena, owned by the gradient communicator
  std::unique_ptr<Reducer> reducer_;
  std::shared_ptr<Optimizer> optimizer_;  // shared with fused_, whose calls may outlive this
  std::shared_ptr<FusedShardUpdate> fused_;
  FlightRecorder* flight_ = nullptr;
};

}  // namespace ddp
