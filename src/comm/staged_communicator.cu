// Gradients in GPU memory, averaged by MPI through page-locked host memory (see cuda_comm.h).
// Every step of a bucket's allreduce runs on the host communicator's thread, in bucket order:
// wait for the event recorded on the compute stream when the bucket's last gradient was
// queued, copy the bucket to its host mirror, allreduce it there, copy it back.
#include "../cuda/cuda_api.h"
#include "../cuda/cuda_backend.h"
#include "ddp/cuda.h"
#include "ddp/cuda_comm.h"

namespace ddp {

namespace {

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(Communicator& host, Backend& backend) : host_(host) {
    backend_ = dynamic_cast<cuda::CudaBackend*>(&backend);
    DDP_CHECK(backend_ != nullptr,
              "the staged communicator needs the CUDA backend, got '" << backend.name() << "'");
    device_ = backend_->ordinal();
    DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&lane_stream_, cudaStreamNonBlocking));
  }

  ~StagedCommunicator() override {
    if (registered_) (void)cudaHostUnregister(mirror_);
    if (lane_stream_ != nullptr) (void)cudaStreamDestroy(lane_stream_);
  }

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  int local_rank() const override { return host_.local_rank(); }
  int local_size() const override { return host_.local_size(); }

  float* gradient_arena(size_t numel, bool shared) override {
    DDP_CHECK(arena_.size() == 0, "gradient_arena() called twice");
    arena_ = DeviceArray<float>(numel);
    if (numel > 0) cuda_zero_bytes(arena_.data(), numel * sizeof(float));
    mirror_ = host_.gradient_arena(numel, shared);
    if (numel > 0) {
      // Page-locked, the copies run at full speed and asynchronously; if the mirror cannot be
      // locked (some shared-memory windows cannot), they still work, staged by the driver.
      registered_ =
          cudaHostRegister(mirror_, numel * sizeof(float), cudaHostRegisterDefault) == cudaSuccess;
      if (!registered_) (void)cudaGetLastError();
    }
    return arena_.data();
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average,
                                        const LaneHooks* hooks) override {
    DDP_CHECK(hooks == nullptr, "the staged communicator makes its own lane hooks");
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
    LaneHooks lane;
    lane.ready = [device, ready] {
      cuda_set_device(device);  // the lane's thread is not the one that chose the device
      const cudaError_t rc = cudaEventSynchronize(ready);
      (void)cudaEventDestroy(ready);
      DDP_CUDA_CHECK(rc);
    };
    lane.before = [=] {
      DDP_CUDA_CHECK(cudaMemcpyAsync(host, data, bytes, cudaMemcpyDeviceToHost, stream));
      DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
    };
    lane.after = [=] {
      DDP_CUDA_CHECK(cudaMemcpyAsync(data, host, bytes, cudaMemcpyHostToDevice, stream));
      DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
    };
    return host_.allreduce_async(host, count, average, &lane);
  }

  void allreduce(double* data, size_t count, ReduceOp op) override {
    host_.allreduce(data, count, op);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    host_.broadcast(data, bytes, root);
  }
  void barrier() override { host_.barrier(); }
  void set_timeout(double seconds) override { host_.set_timeout(seconds); }
  double timeout() const override { return host_.timeout(); }

 private:
  Communicator& host_;
  cuda::CudaBackend* backend_ = nullptr;
  int device_ = 0;
  cudaStream_t lane_stream_ = nullptr;
  DeviceArray<float> arena_;
  float* mirror_ = nullptr;
  bool registered_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(Communicator& host, Backend& backend) {
  return std::make_unique<StagedCommunicator>(host, backend);
}

}  // namespace ddp
