// PowerSGD's compressor of one bucket on a GPU (device_powersgd.h), and the NCCL communicator's
// compressors (device_communicators.h).
#include <string>
#include <utility>

#include "comm/device_communicators.h"
#include "comm/nccl/device_powersgd.h"
#include "comm/nccl/stream_reducer.h"
#include "core/check.h"

namespace ddp {

namespace {

// The factored matrices as the kernels see them, each with the rows, columns and values of
// those before it; `totals` gets all of them (its list is left to the caller).
std::vector<cuda::FactoredMatrix> factored_list(const PowerSgdPlan& plan,
                                                cuda::FactoredMatrices& totals) {
  std::vector<cuda::FactoredMatrix> list;
  int64_t rows = 0, cols = 0, values = 0;
  for (const PowerSgdPlan::Entry& e : plan.entries()) {
    if (e.rank == 0) continue;
    cuda::FactoredMatrix f;
    f.offset = static_cast<int64_t>(e.m.offset);
    f.rows = static_cast<int64_t>(e.m.rows);
    f.cols = static_cast<int64_t>(e.m.cols);
    f.rank = static_cast<int64_t>(e.rank);
    f.p_at = static_cast<int64_t>(e.p_at);
    f.q_at = static_cast<int64_t>(e.q_at);
    f.first_row = rows;
    f.first_col = cols;
    f.first_value = values;
    rows += f.rows;
    cols += f.cols;
    values += f.rows * f.cols;
    list.push_back(f);
  }
  totals.rows = rows;
  totals.cols = cols;
  totals.values = values;
  return list;
}

}  // namespace

DevicePowerSgdBucket::DevicePowerSgdBucket(const PowerSgdLayout& layout,
                                           const PowerSgdOptions& options, int sm_count)
    : plan_(layout.params, layout.numel, options), options_(options), sm_count_(sm_count) {
  const std::vector<cuda::FactoredMatrix> list = factored_list(plan_, factored_);
  list_ = DeviceArray<cuda::FactoredMatrix>(list.size());
  list_.upload(list.data(), list.size());
  factored_.list = list_.data();
  factored_.count = static_cast<int>(list.size());
  size_t at = 0;
  for (const PowerSgdPlan::Entry& e : plan_.entries()) {
    if (e.rank > 0) continue;
    whole_.push_back({e.m.offset, e.m.rows * e.m.cols, at});
    at += e.m.rows * e.m.cols;
  }
  if (options_.error_feedback) error_ = DeviceArray<float>(plan_.numel());
  q_ = DeviceArray<float>(plan_.q_size());
  wire_ = DeviceArray<float>(plan_.whole_floats() + plan_.p_size());
  flags_ = DeviceArray<cuda::PowerSgdFlags>(1);
  const cuda::PowerSgdFlags none;
  flags_.upload(&none, 1);
  DDP_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

DevicePowerSgdBucket::~DevicePowerSgdBucket() {
  if (done_ != nullptr) (void)cudaEventDestroy(done_);
}

void DevicePowerSgdBucket::reduce(float* bucket, int world, bool average, uint64_t seed,
                                  const DeviceSum& sum, cudaStream_t stream) {
  const int64_t numel = static_cast<int64_t>(plan_.numel());
  cuda::PowerSgdFlags* flags = flags_.data();
  if (options_.error_feedback)
    cuda::powersgd_add_error(bucket, error_.data(), numel, flags, sm_count_, stream);
  // Q: a random start where there is none (or every step without warm start), orthogonalised.
  cuda::powersgd_start_q(q_.data(), static_cast<int64_t>(plan_.q_size()), seed,
                         !options_.warm_start, flags, stream);
  cuda::powersgd_orthogonalize(q_.data(), factored_, true, stream);
  // The first sum: the whole parameters, then P = M Q.
  for (const Whole& w : whole_)
    DDP_CUDA_CHECK(cudaMemcpyAsync(wire_.data() + w.wire_at, bucket + w.offset,
                                   w.numel * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  float* p = wire_.data() + plan_.whole_floats();
  cuda::powersgd_compute_p(bucket, q_.data(), p, factored_, stream);
  if (wire_.size() > 0) sum(wire_.data(), wire_.size());
  for (const Whole& w : whole_)
    DDP_CUDA_CHECK(cudaMemcpyAsync(bucket + w.offset, wire_.data() + w.wire_at,
                                   w.numel * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  // The second: Q = M^T P from the orthogonalised P; then M = P Q^T.
  cuda::powersgd_orthogonalize(p, factored_, false, stream);
  cuda::powersgd_compute_q(bucket, p, q_.data(), factored_, stream);
  if (q_.size() > 0) sum(q_.data(), q_.size());
  cuda::powersgd_decompress(p, q_.data(), bucket, factored_, sm_count_, stream);
  cuda::powersgd_check_finite(bucket, numel, flags, sm_count_, stream);
  cuda::powersgd_finish(bucket, error_.data(), numel, 1.0f / static_cast<float>(world),
                        options_.error_feedback, average, flags, sm_count_, stream);
  DDP_CUDA_CHECK(cudaEventRecord(done_, stream));
  queued_ = true;
}

cuda::PowerSgdFlags DevicePowerSgdBucket::flags() const {
  if (queued_) DDP_CUDA_CHECK(cudaEventSynchronize(done_));
  cuda::PowerSgdFlags f;
  flags_.download(&f, 1);
  return f;
}

std::vector<float> DevicePowerSgdBucket::error() const {
  if (flags().has_error == 0 || error_.size() == 0) return {};
  std::vector<float> host(error_.size());
  error_.download(host.data(), host.size());
  return host;
}

std::vector<float> DevicePowerSgdBucket::q() const {
  if (flags().has_q == 0 || q_.size() == 0) return {};
  std::vector<float> host(q_.size());
  q_.download(host.data(), host.size());
  return host;
}

void DevicePowerSgdBucket::restore(const std::vector<float>& error, const std::vector<float>& q) {
  check_powersgd_state(plan_, error, q);
  if (queued_) DDP_CUDA_CHECK(cudaEventSynchronize(done_));
  cuda::PowerSgdFlags f;
  // Without error feedback a kept error is dropped, as the host's compressor never reads it.
  f.has_error = !error.empty() && error_.size() > 0 ? 1 : 0;
  f.has_q = !q.empty() ? 1 : 0;
  if (f.has_error != 0) error_.upload(error.data(), error.size());
  if (f.has_q != 0) q_.upload(q.data(), q.size());
  flags_.upload(&f, 1);
}

namespace {

// A DevicePowerSgdBucket queued on the NCCL communicator's stream.
class NcclCompressor final : public PowerSgdCompressor {
 public:
  NcclCompressor(StreamReducer& nccl, const PowerSgdLayout& layout, const PowerSgdOptions& options,
                 int world)
      : nccl_(nccl), bucket_(layout, options, nccl.sm_count()), world_(world) {}

  const PowerSgdPlan& plan() const override { return bucket_.plan(); }

  std::shared_ptr<Work> reduce_async(float* data, bool average, uint64_t seed) override {
    const size_t count = plan().numel(), sent = plan().sent_floats();
    return nccl_.reduce_on_stream("NCCL PowerSGD allreduce of " + std::to_string(count) +
                                      " floats as " + std::to_string(sent),
                                  sent * sizeof(float),
                                  [&](cudaStream_t stream, const StreamReducer::Sum& sum) {
                                    bucket_.reduce(data, world_, average, seed, sum, stream);
                                  });
  }

  std::vector<float> error() const override { return bucket_.error(); }
  std::vector<float> q() const override { return bucket_.q(); }
  void restore(std::vector<float> error, std::vector<float> q) override {
    bucket_.restore(error, q);
  }

 private:
  StreamReducer& nccl_;
  DevicePowerSgdBucket bucket_;
  int world_;
};

}  // namespace

PowerSgdCompressors nccl_powersgd_compressors(GradientCommunicator& nccl,
                                              const std::vector<PowerSgdLayout>& buckets,
                                              const PowerSgdOptions& options, int world) {
  auto* reducer = dynamic_cast<StreamReducer*>(&nccl);
  DDP_CHECK(reducer != nullptr,
            "distributed.compression: powersgd on GPUs needs the NCCL communicator "
            "(distributed.backend: nccl)");
  PowerSgdCompressors compressors;
  for (const PowerSgdLayout& b : buckets)
    compressors.push_back(std::make_unique<NcclCompressor>(*reducer, b, options, world));
  return compressors;
}

}  // namespace ddp
