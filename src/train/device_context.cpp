// The two device contexts (device_context.h): the host, with the Eigen backend, and a GPU,
// with the CUDA backend, double-buffered batch uploads and a NCCL or host-staged gradient
// communicator. A build without CUDA links the CUDA entry points' stubs, which throw.
#include "train/device_context.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "comm/device_communicators.h"
#include "core/clock.h"
#include "kernels/cuda/cuda.h"

namespace ddp {

double Mark::time() const { return device ? device->time() : host; }

namespace {

class HostFeed final : public BatchFeed {
 public:
  explicit HostFeed(int64_t features) : features_(features) {}
  bool start(std::function<const Batch*()> next) override {
    next_ = std::move(next);
    batch_ = next_();
    return batch_ != nullptr;
  }
  DeviceBatch take() override {
    Tensor x{const_cast<float*>(batch_->x.data()), batch_->rows, features_, Device::CPU};
    return DeviceBatch{x, batch_->y.data(), batch_->rows};
  }
  // The loader may reuse the batch's memory from its next call on: only after the compute.
  bool advance() override {
    batch_ = next_();
    return batch_ != nullptr;
  }

 private:
  int64_t features_;
  std::function<const Batch*()> next_;
  const Batch* batch_ = nullptr;
};

class HostContext final : public DeviceContext {
 public:
  explicit HostContext(DevicePlacement placement)
      : placement_(std::move(placement)), backend_(make_cpu_backend()) {
    set_flush_denormals(true);  // this is the thread that computes (see backend.h)
  }
  Backend& backend() override { return *backend_; }
  const DevicePlacement& placement() const override { return placement_; }
  std::string describe() const override { return placement_.describe(); }
  size_t pipeline_depth() const override { return 0; }
  size_t arena_alignment() const override { return 1; }
  Mark mark() override { return Mark{nullptr, seconds_now()}; }
  double compute_seconds(double, double, double thread_cpu) const override { return thread_cpu; }
  bool host_waits_for_buckets() const override { return true; }
  std::unique_ptr<GradientCommunicator> make_gradient_communicator(
      ProcessGroup&, HostGradientCommunicator&, const DistributedConfig&) override {
    return nullptr;
  }
  std::unique_ptr<ShardedCommunicator> make_sharded_communicator(
      ProcessGroup&, const DistributedConfig&) override {
    return nullptr;
  }
  std::string describe_gradients() const override { return ""; }
  void copy_to_host(float* host, const float* device, size_t count) override {
    std::copy(device, device + count, host);
  }
  void copy_from_host(float* device, const float* host, size_t count) override {
    std::copy(host, host + count, device);
  }
  std::unique_ptr<BatchFeed> make_batch_feed(int64_t, int64_t features) override {
    return std::make_unique<HostFeed>(features);
  }
  std::string compute_track_name() const override { return "training thread"; }
  std::string comm_track_name() const override { return "comm thread"; }

 private:
  DevicePlacement placement_;
  std::unique_ptr<Backend> backend_;
};

// The next batch travels to the device (a copy stream) while the current one computes.
class UploadFeed final : public BatchFeed {
 public:
  UploadFeed(Backend& backend, int64_t max_rows, int64_t features)
      : uploader_(backend, max_rows, features) {}
  bool start(std::function<const Batch*()> next) override {
    next_ = std::move(next);
    batch_ = next_();
    if (batch_ != nullptr) upload(*batch_);
    return batch_ != nullptr;
  }
  DeviceBatch take() override {
    const int64_t rows = batch_->rows;
    const BatchUploader::DeviceBatch db = uploader_.acquire();
    following_ = next_();
    if (following_ != nullptr) upload(*following_);
    return DeviceBatch{db.x, db.labels, rows};
  }
  bool advance() override {
    batch_ = following_;
    return batch_ != nullptr;
  }

 private:
  void upload(const Batch& b) { uploader_.upload(b.x.data(), b.y.data(), b.rows); }

  BatchUploader uploader_;
  std::function<const Batch*()> next_;
  const Batch* batch_ = nullptr;      // the batch take() hands out
  const Batch* following_ = nullptr;  // the one uploading meanwhile
};

class CudaContext final : public DeviceContext {
 public:
  explicit CudaContext(DevicePlacement placement)
      : placement_(std::move(placement)), backend_(make_cuda_backend(placement_.gpu)) {}
  Backend& backend() override { return *backend_; }
  const DevicePlacement& placement() const override { return placement_; }
  std::string describe() const override {
    return placement_.describe() + " " + cuda_device_info(placement_.gpu).name;
  }
  size_t pipeline_depth() const override { return 1; }
  size_t arena_alignment() const override { return 4; }  // 16-byte aligned for the kernels
  Mark mark() override { return Mark{mark_stream(*backend_), 0.0}; }
  double compute_seconds(double begin, double end, double) const override { return end - begin; }
  bool host_waits_for_buckets() const override { return false; }
  std::unique_ptr<GradientCommunicator> make_gradient_communicator(
      ProcessGroup& group, HostGradientCommunicator& host, const DistributedConfig& cfg) override {
    if (!uses_nccl()) return make_staged_communicator(host, *backend_);
    return make_sharded_communicator(group, cfg);
  }
  // The gradient path refuses a sharded optimizer on the staged communicator.
  std::unique_ptr<ShardedCommunicator> make_sharded_communicator(
      ProcessGroup& group, const DistributedConfig& cfg) override {
    NcclOptions options;
    options.algo = cfg.nccl_algo;
    options.timeout_s = cfg.timeout_s;
    return make_nccl_communicator(group, *backend_, options);
  }
  // After the communicator exists: NCCL's setup decides NCCL_ALGO.
  std::string describe_gradients() const override {
    std::string algo;
    if (uses_nccl()) {
      const char* env_algo = std::getenv("NCCL_ALGO");
      algo = " NCCL " + nccl_version() + ", NCCL_ALGO=" + (env_algo ? env_algo : "(NCCL's choice)");
    }
    return "gradients: " + std::string(to_string(placement_.backend)) + algo +
           ", allreduce per bucket on its own stream";
  }
  void copy_to_host(float* host, const float* device, size_t count) override {
    if (count > 0) cuda_copy_bytes(host, device, count * sizeof(float));
  }
  void copy_from_host(float* device, const float* host, size_t count) override {
    if (count > 0) cuda_copy_bytes(device, host, count * sizeof(float));
  }
  std::unique_ptr<BatchFeed> make_batch_feed(int64_t max_rows, int64_t features) override {
    return std::make_unique<UploadFeed>(*backend_, max_rows, features);
  }
  std::string compute_track_name() const override { return "compute stream"; }
  std::string comm_track_name() const override {
    return uses_nccl() ? "NCCL stream" : "comm thread (staged)";
  }

 private:
  bool uses_nccl() const { return placement_.backend == BackendChoice::Nccl; }

  DevicePlacement placement_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace

DevicePlacement place_rank(const TrainConfig& cfg, const ProcessGroup& comm) {
  std::string why_none;
  const int visible = cfg.device == DeviceChoice::Cpu ? 0 : cuda_device_count(&why_none);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  Environment env;
  env.rank = comm.rank();
  env.world = comm.size();
  env.local_rank = comm.local_rank();
  env.local_size = comm.local_size();
  env.host = host;
  return choose_device(cfg.device, cfg.distributed.backend, cfg.distributed.gpus, env, visible,
                       why_none);
}

std::unique_ptr<DeviceContext> make_device_context(const DevicePlacement& placement) {
  if (placement.device == Device::CUDA) return std::make_unique<CudaContext>(placement);
  return std::make_unique<HostContext>(placement);
}

}  // namespace ddp
