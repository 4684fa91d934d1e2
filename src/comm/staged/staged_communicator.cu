// Gradients in GPU memory, averaged by MPI through page-locked host memory
// (see device_communicators.h).
// Every step of a bucket's allreduce runs on the host communicator's thread, in bucket order:
// wait for the event recorded on the compute stream when the bucket's last gradient was
// queued, copy the bucket to its host mirror, allreduce it there, copy it back. Its waits on the
// GPU poll events like the lane's other waits (cudaEventSynchronize would spin on the core
// the training thread and the peers may need, and has no deadline).
#include <string>

#include "comm/device_communicators.h"
#include "comm/mpi/lane.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_backend.h"

namespace ddp {

namespace {

// Waits for `event` to complete within timeout_s, yielding the core meanwhile.
void await_event(cudaEvent_t event, double timeout_s, const std::string& what) {
  cudaError_t rc = cudaSuccess;
  const auto done = [&] {
    rc = cudaEventQuery(event);
    if (rc != cudaErrorNotReady) return true;
    (void)cudaGetLastError();  // "not ready" is no error, but some runtimes also record it as one
    return false;
  };
  if (poll_until(done, timeout_s, nullptr) != WaitResult::Done)
    throw_collective_timeout(what, timeout_s);
  DDP_CUDA_CHECK(rc);
}

class StagedCommunicator final : public GradientCommunicator {
 public:
  StagedCommunicator(HostGradientCommunicator& host, Backend& backend) : host_(host) {
    backend_ = dynamic_cast<cuda::CudaBackend*>(&backend);
    DDP_CHECK(backend_ != nullptr,
              "the staged communicator needs the CUDA backend, got '" << backend.name() << "'");
    device_ = backend_->ordinal();
    DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&lane_stream_, cudaStreamNonBlocking));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  }

  ~StagedCommunicator() override {
    if (registered_) (void)cudaHostUnregister(mirror_);
    if (copied_ != nullptr) (void)cudaEventDestroy(copied_);
    if (lane_stream_ != nullptr) (void)cudaStreamDestroy(lane_stream_);
  }

  // The host communicator compresses the mirror's buckets on its lane (and on one node's
  // shared memory only with wire.on_node, as for CPU ranks), and sums them across nodes by its
  // hierarchy (the mirror is a node's shared-memory window); the copies stay float32.
  float* gradient_arena(size_t numel, const BucketWire& wire) override {
    DDP_CHECK(arena_.size() == 0, "gradient_arena() called twice");
    arena_ = DeviceArray<float>(numel);
    if (numel > 0) cuda_zero_bytes(arena_.data(), numel * sizeof(float));
    mirror_ = host_.gradient_arena(numel, wire);
    if (numel > 0) {
      // Page-locked, the copies run at full speed and asynchronously; if the mirror cannot be
      // locked (some shared-memory windows cannot), they still work, staged by the driver.
      registered_ =
          cudaHostRegister(mirror_, numel * sizeof(float), cudaHostRegisterDefault) == cudaSuccess;
      if (!registered_) (void)cudaGetLastError();
    }
    return arena_.data();
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average) override {
    DDP_CHECK(data >= arena_.data() && data + count <= arena_.data() + arena_.size(),
              "staged allreduce: the data must lie in this communicator's gradient arena");
    const size_t offset = static_cast<size_t>(data - arena_.data());
    float* host = mirror_ + offset;
    const size_t bytes = count * sizeof(float);
    cudaEvent_t ready = nullptr;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    DDP_CUDA_CHECK(cudaEventRecord(ready, backend_->stream()));
    const int device = device_;
    cudaStream_t stream = lane_stream_;
    cudaEvent_t copied = copied_;  // one at a time: the lane runs one collective at a time
    HostGradientCommunicator& comm = host_;
    const std::string what = "allreduce of " + std::to_string(count) + " floats";
    LaneHooks lane;
    lane.ready = [device, ready, &comm, what] {
      cuda_set_device(device);  // the thread running the lane may not be the one that chose it
      struct Destroy {
        cudaEvent_t e;
        ~Destroy() { (void)cudaEventDestroy(e); }
      } destroy{ready};
      await_event(ready, comm.timeout(), what + ": its gradients on the GPU");
    };
    lane.before = [=, &comm] {
      DDP_CUDA_CHECK(cudaMemcpyAsync(host, data, bytes, cudaMemcpyDeviceToHost, stream));
      DDP_CUDA_CHECK(cudaEventRecord(copied, stream));
      await_event(copied, comm.timeout(), what + ": copy to host memory");
    };
    lane.after = [=, &comm] {
      DDP_CUDA_CHECK(cudaMemcpyAsync(data, host, bytes, cudaMemcpyHostToDevice, stream));
      DDP_CUDA_CHECK(cudaEventRecord(copied, stream));
      await_event(copied, comm.timeout(), what + ": copy back to the GPU");
    };
    return host_.allreduce_on_lane(host, count, average, lane);
  }

  void set_timeout(double seconds) override { host_.set_timeout(seconds); }
  double timeout() const override { return host_.timeout(); }

 private:
  HostGradientCommunicator& host_;
  cuda::CudaBackend* backend_ = nullptr;
  int device_ = 0;
  cudaStream_t lane_stream_ = nullptr;
  cudaEvent_t copied_ = nullptr;  // recorded behind each copy the lane waits for
  DeviceArray<float> arena_;
  float* mirror_ = nullptr;
  bool registered_ = false;
};

}  // namespace

std::unique_ptr<GradientCommunicator> make_staged_communicator(HostGradientCommunicator& host,
                                                               Backend& backend) {
  return std::make_unique<StagedCommunicator>(host, backend);
}

}  // namespace ddp
