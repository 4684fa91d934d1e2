// Double-buffered batch upload: two pinned staging slots, copies on their own stream, events
// between that stream and the backend's compute stream in both directions (the compute stream
// waits for a batch to arrive; the copy stream waits for the compute work on a slot's previous
// batch before overwriting it). The host blocks only to reuse a pinned slot whose previous copy
// is still running.
#include <cstring>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_backend.h"

namespace ddp {

struct BatchUploader::Impl {
  enum class SlotState { kFree, kUploaded, kInUse };
  struct Slot {
    PinnedArray<float> x_host;
    PinnedArray<int32_t> labels_host;
    Buffer x_device;
    DeviceArray<int32_t> labels_device;
    cudaEvent_t uploaded = nullptr;  // recorded on the copy stream after the transfer
    cudaEvent_t consumed = nullptr;  // recorded on the compute stream after the batch's work
    bool ever_uploaded = false;
    bool ever_consumed = false;
    int64_t rows = 0;
    SlotState state = Impl::SlotState::kFree;
  };

  cuda::CudaBackend* backend = nullptr;
  int64_t max_rows = 0, features = 0;
  cudaStream_t copy_stream = nullptr;
  Slot slots[2];
  int next_upload = 0, next_acquire = 0, in_use = -1;

  ~Impl() {
    if (copy_stream != nullptr) {
      (void)cudaStreamSynchronize(copy_stream);
      (void)cudaStreamDestroy(copy_stream);
    }
    for (Slot& s : slots) {
      if (s.uploaded != nullptr) (void)cudaEventDestroy(s.uploaded);
      if (s.consumed != nullptr) (void)cudaEventDestroy(s.consumed);
    }
  }
};

BatchUploader::BatchUploader(Backend& backend, int64_t max_rows, int64_t features)
    : impl_(std::make_unique<Impl>()) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  DDP_CHECK(cuda_backend != nullptr,
            "BatchUploader: backend '" << backend.name() << "' is not the CUDA backend");
  DDP_CHECK(max_rows > 0 && features > 0, "BatchUploader: max_rows " << max_rows << " and features "
                                                                     << features
                                                                     << " must be positive");
  Impl& im = *impl_;
  im.backend = cuda_backend;
  im.max_rows = max_rows;
  im.features = features;
  DDP_CUDA_CHECK(cudaStreamCreate(&im.copy_stream));
  for (Impl::Slot& s : im.slots) {
    s.x_host = PinnedArray<float>(static_cast<size_t>(max_rows * features));
    s.labels_host = PinnedArray<int32_t>(static_cast<size_t>(max_rows));
    s.x_device = Buffer(static_cast<size_t>(max_rows * features), Device::CUDA);
    s.labels_device = DeviceArray<int32_t>(static_cast<size_t>(max_rows));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&s.uploaded, cudaEventDisableTiming));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&s.consumed, cudaEventDisableTiming));
  }
}

BatchUploader::~BatchUploader() = default;

void BatchUploader::upload(const float* x, const int32_t* labels, int64_t rows) {
  Impl& im = *impl_;
  DDP_CHECK(rows >= 1 && rows <= im.max_rows,
            "BatchUploader::upload: " << rows << " rows, expected 1.." << im.max_rows);
  Impl::Slot& s = im.slots[im.next_upload];
  DDP_CHECK(s.state == Impl::SlotState::kFree,
            "BatchUploader::upload: both slots are taken (one batch waiting, one in use, or two "
            "waiting): acquire() before uploading more");
  // The pinned slot is rewritten by the host: its previous transfer must have left it.
  if (s.ever_uploaded) DDP_CUDA_CHECK(cudaEventSynchronize(s.uploaded));
  const size_t x_bytes = static_cast<size_t>(rows * im.features) * sizeof(float);
  std::memcpy(s.x_host.data(), x, x_bytes);
  std::memcpy(s.labels_host.data(), labels, static_cast<size_t>(rows) * sizeof(int32_t));
  // The device slot is rewritten by the copy: the compute work on its last batch must be done.
  if (s.ever_consumed) DDP_CUDA_CHECK(cudaStreamWaitEvent(im.copy_stream, s.consumed, 0));
  DDP_CUDA_CHECK(cudaMemcpyAsync(s.x_device.data(), s.x_host.data(), x_bytes,
                                 cudaMemcpyHostToDevice, im.copy_stream));
  DDP_CUDA_CHECK(cudaMemcpyAsync(s.labels_device.data(), s.labels_host.data(),
                                 static_cast<size_t>(rows) * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, im.copy_stream));
  DDP_CUDA_CHECK(cudaEventRecord(s.uploaded, im.copy_stream));
  s.ever_uploaded = true;
  s.rows = rows;
  s.state = Impl::SlotState::kUploaded;
  im.next_upload ^= 1;
}

BatchUploader::DeviceBatch BatchUploader::acquire() {
  Impl& im = *impl_;
  Impl::Slot& s = im.slots[im.next_acquire];
  DDP_CHECK(s.state == Impl::SlotState::kUploaded, "BatchUploader::acquire: no batch was uploaded");
  const cudaStream_t compute = im.backend->stream();
  // Everything queued so far used the previous batch: release its slot behind that work.
  if (im.in_use >= 0) {
    Impl::Slot& previous = im.slots[im.in_use];
    DDP_CUDA_CHECK(cudaEventRecord(previous.consumed, compute));
    previous.ever_consumed = true;
    previous.state = Impl::SlotState::kFree;
  }
  DDP_CUDA_CHECK(cudaStreamWaitEvent(compute, s.uploaded, 0));
  s.state = Impl::SlotState::kInUse;
  im.in_use = im.next_acquire;
  im.next_acquire ^= 1;
  DeviceBatch batch;
  batch.x = Tensor{s.x_device.data(), s.rows, im.features, Device::CUDA};
  batch.labels = s.labels_device.data();
  return batch;
}

}  // namespace ddp
