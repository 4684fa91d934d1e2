// PowerSGD's compressor of one bucket on a GPU (the algorithm: comm/powersgd.h; the kernels:
// kernels/cuda/powersgd_kernels.h): the host's PowerSgdBucket with its state (the error
// feedback, Q, whether it holds them) in device memory and every step queued on a stream, so
// the host never waits inside a step, not even to learn that a step was not finite. Its two
// sums over ranks are the caller's, queued on the same stream (NCCL's allreduce).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/powersgd.h"
#include "comm/powersgd_communicator.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/powersgd_kernels.h"

namespace ddp {

class DevicePowerSgdBucket {
 public:
  /// Queues a sum over ranks of `count` device floats in place on the stream reduce() was
  /// given: the same bits on every rank.
  using DeviceSum = std::function<void(float* data, size_t count)>;

  /// `sm_count`: the device's multiprocessors, for the grids. Uploads the plan (synchronous).
  DevicePowerSgdBucket(const PowerSgdLayout& layout, const PowerSgdOptions& options, int sm_count);
  ~DevicePowerSgdBucket();
  DevicePowerSgdBucket(const DevicePowerSgdBucket&) = delete;
  DevicePowerSgdBucket& operator=(const DevicePowerSgdBucket&) = delete;

  const PowerSgdPlan& plan() const { return plan_; }

  /// Queues on `stream` what PowerSgdBucket::reduce does to `bucket` (device memory, this
  /// rank's share), then with `average` the division by `world`.
  void reduce(float* bucket, int world, bool average, uint64_t seed, const DeviceSum& sum,
              cudaStream_t stream);

  /// The state in host memory, as PowerSgdBucket's (empty: none), once the last reduce() queued
  /// has run (this waits for it).
  std::vector<float> error() const;
  std::vector<float> q() const;
  /// Restores that state (synchronous, between steps; check_powersgd_state's sizes).
  void restore(const std::vector<float>& error, const std::vector<float>& q);

 private:
  cuda::PowerSgdFlags flags() const;

  PowerSgdPlan plan_;
  PowerSgdOptions options_;
  int sm_count_ = 1;
  DeviceArray<cuda::FactoredMatrix> list_;
  cuda::FactoredMatrices factored_;
  struct Whole {
    size_t offset = 0, numel = 0, wire_at = 0;  // a parameter sent whole, and where in the wire
  };
  std::vector<Whole> whole_;
  DeviceArray<float> error_, q_;
  DeviceArray<float> wire_;  // the whole parameters, then P: the first sum's floats
  DeviceArray<cuda::PowerSgdFlags> flags_;
  cudaEvent_t done_ = nullptr;  // after the last reduce() queued
  bool queued_ = false;
};

}  // namespace ddp
