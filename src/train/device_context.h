// What differs between training on the host and on a GPU, in one place: the backend, how a batch
// reaches the device, how the step's moments are timed, how many steps the host keeps queued,
// how parameters are aligned, which communicator moves gradients and how values travel to and
// from host memory. The step and the epoch loop ask this interface and never branch on the
// device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/environment.h"
#include "comm/gradient_communicator.h"
#include "comm/process_group.h"
#include "core/tensor.h"
#include "data/loader.h"
#include "ddp/config.h"
#include "kernels/backend.h"

namespace ddp {

class StreamMark;

/// A moment in a step on the host clock: taken at once on the host; on a GPU a mark in the
/// compute stream, resolved once the device got there (so recording one never waits).
struct Mark {
  std::shared_ptr<StreamMark> device;
  double host = 0.0;
  double time() const;
};

/// A batch where the device computes on it.
struct DeviceBatch {
  Tensor x;                         ///< [rows, features]
  const int32_t* labels = nullptr;  ///< [rows]
  int64_t rows = 0;
};

/// The batches of one pass over a split, on their way to the device. take() hands the current
/// batch to the computation, advance() moves to the next. On the host the loader's batch is
/// used where it lies; on a GPU the next batch is uploaded while the current one computes.
class BatchFeed {
 public:
  virtual ~BatchFeed() = default;
  /// Begins a pass that reads host batches from `next` (nullptr at the end); false when there
  /// is no batch at all.
  virtual bool start(std::function<const Batch*()> next) = 0;
  /// The current batch, valid until advance(). Once per batch.
  virtual DeviceBatch take() = 0;
  /// Moves to the next batch; false at the end of the pass.
  virtual bool advance() = 0;
};

class DeviceContext {
 public:
  virtual ~DeviceContext() = default;
  virtual Backend& backend() = 0;
  virtual const DevicePlacement& placement() const = 0;
  Device device() const { return placement().device; }
  /// This rank's device for the startup lines ("cpu", "cuda:1 (nccl) NVIDIA H200").
  virtual std::string describe() const = 0;

  /// Optimizer steps the host keeps queued before it reads their results: 0 on the host (a
  /// step has run when it returns), 1 on a GPU (the host queues step i+1 while the device
  /// runs step i).
  virtual size_t pipeline_depth() const = 0;
  /// Every parameter's offset in the flat arenas is a multiple of this many floats.
  virtual size_t arena_alignment() const = 0;
  virtual Mark mark() = 0;
  /// How long backward really computed, for the overlap statistics: on the host the training
  /// thread's CPU time in it (`thread_cpu`; communication on its core took turns with it), on
  /// a GPU the wall time from `begin` to `end`.
  virtual double compute_seconds(double begin, double end, double thread_cpu) const = 0;
  /// Where a rank waits for its peers' gradients: on the host the training thread waits in
  /// Reducer::finalize; on a GPU the device does (the host only queues the wait), and the
  /// buckets' own times tell how long (bucket_wait).
  virtual bool host_waits_for_buckets() const = 0;

  /// Collective over `group`: the communicator of the gradient buckets on this device (NCCL,
  /// or staged through `host`), or nullptr where `host` (the gradient communicator of host
  /// memory) itself is the one.
  virtual std::unique_ptr<GradientCommunicator> make_gradient_communicator(
      ProcessGroup& group, HostGradientCommunicator& host, const DistributedConfig& cfg) = 0;
  /// The same for a sharded optimizer (NCCL on a GPU; nullptr on the host, whose communicator
  /// is the one).
  virtual std::unique_ptr<ShardedCommunicator> make_sharded_communicator(
      ProcessGroup& group, const DistributedConfig& cfg) = 0;
  /// The startup line about how gradients travel ("" where there is nothing to add).
  virtual std::string describe_gradients() const = 0;

  /// Copies `count` floats between host memory and memory of this device (either way).
  virtual void copy_to_host(float* host, const float* device, size_t count) = 0;
  virtual void copy_from_host(float* device, const float* host, size_t count) = 0;

  /// A feed of batches of up to max_rows x features.
  virtual std::unique_ptr<BatchFeed> make_batch_feed(int64_t max_rows, int64_t features) = 0;

  /// Names of the trace tracks where this device computes and communicates.
  virtual std::string compute_track_name() const = 0;
  virtual std::string comm_track_name() const = 0;
};

/// This rank's device and gradient backend, from the config (device, distributed.backend,
/// distributed.gpus) and the rank's place on its node.
DevicePlacement place_rank(const TrainConfig& cfg, const ProcessGroup& comm);

/// The context of `placement`: the CPU backend (denormals flushed on the calling thread, the
/// one that computes) or the CUDA backend on placement.gpu.
std::unique_ptr<DeviceContext> make_device_context(const DevicePlacement& placement);

}  // namespace ddp
