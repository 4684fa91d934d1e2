// Gradients in GPU memory averaged by NCCL (see device_communicators.h). A bucket's allreduce:
// an event on the compute stream where its last gradient was queued, the comm stream waits on
// it, records a start event, runs ncclAllReduce, records an end event. Work::wait makes the
// compute stream wait on the end event (no host synchronisation inside a step);
// Work::synchronize polls the end event and NCCL's asynchronous error under the timeout,
// aborting the communicator on failure so no rank is left waiting; so does the destructor. The
// comm stream has the device's greatest priority, ahead of backward's kernels. With
// distributed.compression, the comm stream casts the bucket to 16 bits before the collective
// and back after it (PyTorch's bf16/fp16 compress hooks), on one node as across nodes.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/device_communicators.h"
#include "comm/lost_peer.h"
#include "comm/nccl/nccl_flight_ledger.h"
#include "comm/nccl/stream_reducer.h"
#include "comm/shard_plan.h"
#include "core/clock.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_backend.h"

#if defined(DDP_WITH_NCCL)
#include "comm/nccl/nccl_api.h"
#endif

namespace ddp {

#if !defined(DDP_WITH_NCCL)

bool nccl_built() { return false; }
std::string nccl_version() { return "not built (NCCL was not found when this was configured)"; }
std::unique_ptr<ShardedCommunicator> make_nccl_communicator(ProcessGroup&, Backend&,
                                                            const NcclOptions&) {
  DDP_THROW(
      "distributed.backend: nccl is not available: this build has no NCCL (configure with "
      "NCCL installed), use distributed.backend: mpi");
}

#else

bool nccl_built() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

namespace {

class NcclCommunicator;

class NcclWork final : public Work {
 public:
  // Valid for waiting while `owner` lives; the events go back to `clock` whenever it ends.
  NcclWork(NcclCommunicator& owner, std::shared_ptr<cuda::EventClock> clock, cudaEvent_t ready,
           cudaEvent_t start, cudaEvent_t end, std::string what)
      : owner_(owner),
        clock_(std::move(clock)),
        ready_(ready),
        start_(start),
        end_(end),
        what_(std::move(what)) {}
  ~NcclWork() override;
  void wait() override;
  void synchronize() override;
  double start_time() const override { return start_seconds_; }
  double end_time() const override { return end_seconds_; }
  // Read when asked (the last bucket's, for the straggler report): each read is two runtime
  // calls on the host.
  double ready_time() const override {
    if (synchronized_ && ready_seconds_ == 0.0) ready_seconds_ = clock_->seconds(ready_);
    return ready_seconds_;
  }
  cudaEvent_t end_event() const { return end_; }
  void set_seq(uint64_t seq) { seq_ = seq; }

 private:
  NcclCommunicator& owner_;
  std::shared_ptr<cuda::EventClock> clock_;
  cudaEvent_t ready_, start_, end_;
  std::string what_;
  uint64_t seq_ = 0;  // in the flight recorder (0: not numbered)
  bool synchronized_ = false;
  mutable double ready_seconds_ = 0.0;
  double start_seconds_ = 0.0, end_seconds_ = 0.0;
};

// A fence behind replayed collectives (CapturableCommunicator::fence): one event on the
// compute stream.
class NcclFence final : public Work {
 public:
  NcclFence(NcclCommunicator& owner, std::shared_ptr<cuda::EventClock> clock, cudaEvent_t end,
            std::string what)
      : owner_(owner), clock_(std::move(clock)), end_(end), what_(std::move(what)) {}
  ~NcclFence() override { clock_->give_back(end_); }
  void wait() override;
  void synchronize() override;
  double start_time() const override { return 0.0; }
  double end_time() const override { return 0.0; }
  cudaEvent_t end_event() const { return end_; }
  void set_seq(uint64_t seq) { seq_ = seq; }

 private:
  NcclCommunicator& owner_;
  std::shared_ptr<cuda::EventClock> clock_;
  cudaEvent_t end_;
  std::string what_;
  uint64_t seq_ = 0;  // the last of the replayed graph's collectives (0: none numbered)
  bool synchronized_ = false;
};

class NcclCommunicator final : public ShardedCommunicator,
                               public CapturableCommunicator,
                               public StreamReducer {
 public:
  NcclCommunicator(ProcessGroup& group, Backend& backend, const NcclOptions& options)
      : timeout_s_(options.timeout_s) {
    rank_ = group.rank();
    size_ = group.size();
    backend_ = dynamic_cast<cuda::CudaBackend*>(&backend);
    DDP_CHECK(backend_ != nullptr, "NCCL needs the CUDA backend, got '" << backend.name() << "'");
    clock_ = backend_->clock();
    // NCCL reads NCCL_ALGO when the communicator is made; a user's own setting wins.
    if (options.algo == NcclAlgo::Ring) setenv("NCCL_ALGO", "Ring", 0);
    ncclUniqueId id{};
    if (group.rank() == 0) DDP_NCCL_CHECK(ncclGetUniqueId(&id));
    group.broadcast(&id, sizeof(id), 0);
    // The greatest priority, so that a bucket's allreduce kernels are scheduled ahead of the
    // backward kernels queued on the compute stream meanwhile (overlap, not a queue behind them).
    int least = 0, greatest = 0;
    DDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    DDP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    // Non-blocking, so that a peer that never arrives is a timeout and not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, group.size(), id, group.rank(), &config);
    settle(rc, "ncclCommInitRank (" + std::to_string(group.size()) + " ranks)");
  }

  // On an error path a collective may still wait on the stream for a peer that never posts
  // it: every wait here is bounded, and what does not finish in time is aborted (which also
  // releases the stream), so no rank hangs in a destructor.
  ~NcclCommunicator() override {
    ledger_.set_recorder(nullptr);  // no probe of the events from here on
    if (comm_ != nullptr && !aborted_) {
      const double deadline = seconds_now() + std::min(timeout_s_, 30.0);
      ncclResult_t state =
          stream_drained_by(deadline) ? ncclCommFinalize(comm_) : ncclInternalError;
      // A non-blocking communicator finalises asynchronously: wait for it too, then free it.
      while (state == ncclInProgress && seconds_now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      }
      if (state == ncclSuccess) {
        (void)ncclCommDestroy(comm_);
      } else {
        (void)ncclCommAbort(comm_);
      }
    }
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  // wire.on_node does not apply: NCCL moves buckets over NVLink or PCIe on one node too, and
  // compresses there as PyTorch's hooks do; nor does wire.hierarchical (NCCL builds its own
  // hierarchy) or wire.shared_memory.
  float* gradient_arena(size_t numel, const BucketWire& wire) override {
    DDP_CHECK(arena_.size() == 0, "gradient_arena() called twice");
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
    DDP_CHECK(wire.format != Compression::Bf16, "distributed.compression: bf16 needs NCCL >= 2.10");
#endif
    DDP_CHECK(!wire.hierarchical,
              "NCCL builds its own hierarchy: wire.hierarchical is refused "
              "by the gradient path");
    format_ = wire.format;
    arena_ = DeviceArray<float>(numel);
    if (numel > 0) cuda_zero_bytes(arena_.data(), numel * sizeof(float));
    // Each bucket is cast into this image of the arena at its own offset, so buckets in
    // flight together never share it and no collective allocates.
    if (format_ != Compression::None) wire_ = DeviceArray<uint16_t>(numel);
    return arena_.data();
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average) override {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    const ncclRedOp_t op = average ? ncclAvg : ncclSum;
#else
    DDP_CHECK(!average, "averaging needs NCCL >= 2.10 (ncclAvg); pre-scale instead");
    const ncclRedOp_t op = ncclSum;
#endif
    if (format_ != Compression::None) return compressed_allreduce(data, count, op);
    return on_stream("NCCL allreduce of " + std::to_string(count) + " floats",
                     count * sizeof(float), "float32", [&] {
      settle(ncclAllReduce(data, data, count, ncclFloat, op, comm_, stream_), "ncclAllReduce");
    });
  }

  // The sharded optimizer: buckets padded to equal parts (pad_buckets_to_equal_parts), so
  // rank r's part of a bucket is its r-th block, NCCL's in-place reduce-scatter and allgather.
  float* parameter_arena(size_t numel, bool) override {
    DDP_CHECK(parameters_.size() == 0, "parameter_arena() called twice");
    parameters_ = DeviceArray<float>(numel);
    if (numel > 0) cuda_zero_bytes(parameters_.data(), numel * sizeof(float));
    return parameters_.data();
  }

  std::shared_ptr<Work> reduce_scatter_async(float* data, size_t count) override {
    const size_t part = equal_part(count, "reduce-scatter");
    if (format_ != Compression::None) return compressed_reduce_scatter(data, count, part);
    return on_stream("NCCL reduce-scatter of " + std::to_string(count) + " floats",
                     count * sizeof(float), "float32", [&] {
      settle(ncclReduceScatter(data, data + static_cast<size_t>(rank_) * part, part, ncclFloat,
                               ncclSum, comm_, stream_),
             "ncclReduceScatter");
    });
  }

  // Every bucket's allgather in one NCCL group, so NCCL launches them as one operation.
  std::shared_ptr<Work> allgather_async(float* arena, const std::vector<Span>& buckets) override {
    std::vector<size_t> parts;
    for (const Span& b : buckets) parts.push_back(equal_part(b.numel, "allgather"));
    size_t floats = 0;
    for (const Span& b : buckets) floats += b.numel;
    return on_stream("NCCL allgather of the parameters", floats * sizeof(float), "float32", [&] {
      DDP_NCCL_CHECK(ncclGroupStart());
      ncclResult_t rc = ncclSuccess;
      for (size_t i = 0; i < buckets.size() && (rc == ncclSuccess || rc == ncclInProgress); ++i) {
        float* bucket = arena + buckets[i].offset;
        rc = ncclAllGather(bucket + static_cast<size_t>(rank_) * parts[i], bucket, parts[i],
                           ncclFloat, comm_, stream_);
      }
      // The group is closed whatever failed inside it.
      const ncclResult_t end = ncclGroupEnd();
      const bool failed = rc != ncclSuccess && rc != ncclInProgress;
      settle(failed ? rc : end,
             "ncclAllGather of " + std::to_string(buckets.size()) + " buckets (one group)");
    });
  }

  // PowerSGD's reduction of a bucket: its kernels and its ncclAllReduce sums (float32) on the
  // comm stream.
  std::shared_ptr<Work> reduce_on_stream(std::string what, size_t bytes,
                                         const Reduction& reduce) override {
    return on_stream(std::move(what), bytes, "float32", [&] {
      reduce(stream_, [&](float* data, size_t count) {
        settle(ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, stream_),
               "ncclAllReduce of PowerSGD's factors");
      });
    });
  }
  int sm_count() const override { return backend_->sm_count(); }

  std::shared_ptr<Work> fence(std::string what) override {
    DDP_CHECK(!aborted_, what << " refused: the communicator was aborted after an error");
    cudaEvent_t end = clock_->take();
    auto work = std::make_shared<NcclFence>(*this, clock_, end, std::move(what));
    DDP_CUDA_CHECK(cudaEventRecord(end, backend_->stream()));
    work->set_seq(ledger_.replayed(end, work));
    return work;
  }

  void set_flight_recorder(FlightRecorder* recorder) override { ledger_.set_recorder(recorder); }
  void set_capturing(bool capturing) override { ledger_.set_capturing(capturing); }
  void device_times(uint64_t seq, double started, double ended) {
    ledger_.device_times(seq, started, ended);
  }

  void set_timeout(double seconds) override {
    DDP_CHECK(seconds > 0, "communicator timeout must be > 0 s, got " << seconds);
    timeout_s_ = seconds;
  }
  double timeout() const override { return timeout_s_; }

  cudaStream_t compute_stream() const { return backend_->stream(); }

  /// Throws (after aborting NCCL) if NCCL reported an asynchronous error; the flight recorder
  /// hears that the first collective not seen ended failed.
  void check_async(const std::string& what) {
    if (aborted_) DDP_THROW(what << ": the NCCL communicator was aborted after an earlier error");
    ncclResult_t state = ncclSuccess;
    DDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      const std::string detail = ncclGetLastError(comm_);
      ledger_.gave_up(false);
      note_if_peer_lost(state);
      abort();
      DDP_THROW(what << " failed: NCCL reports " << ncclGetErrorString(state)
                     << (detail.empty() ? "" : " (" + detail + ")"));
    }
  }

  /// Waits until `event`, the end of collective `seq` (0: not numbered), completed, polling
  /// NCCL's error state; aborts and throws on error or after the timeout. The flight recorder
  /// hears that `seq` ended, or which collective the wait gave up on. An event that passed is
  /// not enough: NCCL's error may have come since, from a collective after `seq` that the
  /// device already ran, so the error state is read once more (and blames the one after).
  void wait_event(cudaEvent_t event, const std::string& what, uint64_t seq) {
    const double deadline = seconds_now() + timeout_s_;
    for (int spins = 0;; ++spins) {
      const cudaError_t state = cudaEventQuery(event);
      if (state == cudaSuccess) {
        ledger_.completed_through(seq);
        check_async(what);
        return;
      }
      if (state != cudaErrorNotReady) DDP_CUDA_CHECK(state);
      (void)cudaGetLastError();  // not ready is not an error
      check_async(what);
      if (seconds_now() > deadline) {
        ledger_.gave_up(true);
        note_collective_timeout();
        abort();
        DDP_THROW(what << " did not complete within " << timeout_s_
                       << " s (distributed.timeout_s): a peer rank died, stalled or stopped on "
                          "an error; NCCL communicator aborted");
      }
      if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  // The bucket cast to 16 bits, summed in them in place, and cast back, all on the comm stream
  // after the wait for its gradients.
  std::shared_ptr<Work> compressed_allreduce(float* data, size_t count, ncclRedOp_t op) {
    uint16_t* wire = wire_of(data, count, "allreduce");
    return on_stream(compressed_what("allreduce", count), count * sizeof(uint16_t),
                     to_string(format_), [&] {
      to_wire(data, count, wire);
      settle(ncclAllReduce(wire, wire, count, wire_type(), op, comm_, stream_), "ncclAllReduce");
      from_wire(wire, count, data);
    });
  }

  // The same for the sharded optimizer: the whole bucket goes out, only this rank's part of
  // the sum comes back into the float bucket (the optimizer reads no other part).
  std::shared_ptr<Work> compressed_reduce_scatter(float* data, size_t count, size_t part) {
    uint16_t* wire = wire_of(data, count, "reduce-scatter");
    const size_t mine = static_cast<size_t>(rank_) * part;
    return on_stream(compressed_what("reduce-scatter", count), count * sizeof(uint16_t),
                     to_string(format_), [&] {
      to_wire(data, count, wire);
      settle(ncclReduceScatter(wire, wire + mine, part, wire_type(), ncclSum, comm_, stream_),
             "ncclReduceScatter");
      from_wire(wire + mine, part, data + mine);
    });
  }

  std::string compressed_what(const char* collective, size_t count) const {
    return std::string("NCCL ") + collective + " of " + std::to_string(count) + " floats as " +
           to_string(format_);
  }

  void to_wire(const float* data, size_t count, uint16_t* wire) {
    backend_->cast_to_16bit(cast_type(), data, static_cast<int64_t>(count), wire, stream_);
  }
  void from_wire(const uint16_t* wire, size_t count, float* data) {
    backend_->cast_from_16bit(cast_type(), wire, static_cast<int64_t>(count), data, stream_);
  }

  // The 16-bit image of data[0, count), which must lie in the gradient arena.
  uint16_t* wire_of(const float* data, size_t count, const char* what) {
    DDP_CHECK(data >= arena_.data() && count <= arena_.size() &&
                  static_cast<size_t>(data - arena_.data()) <= arena_.size() - count,
              "NCCL compressed " << what << ": the data is not in this communicator's arena");
    return wire_.data() + (data - arena_.data());
  }

  cuda::Float16Type cast_type() const {
    return format_ == Compression::Bf16 ? cuda::Float16Type::Bf16 : cuda::Float16Type::Fp16;
  }
  ncclDataType_t wire_type() const {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    if (format_ == Compression::Bf16) return ncclBfloat16;
#endif
    return ncclHalf;
  }

  // A collective on the comm stream: it waits for what the compute stream queued before it
  // (an event), and its Work for the events around it.
  // `bytes` and `wire`: what goes over the network, for the flight recorder.
  std::shared_ptr<Work> on_stream(std::string what, size_t bytes, std::string wire,
                                  const std::function<void()>& issue) {
    DDP_CHECK(!aborted_, what << " refused: the communicator was aborted after an error");
    cudaEvent_t ready = clock_->take(), start = clock_->take(), end = clock_->take();
    auto work = std::make_shared<NcclWork>(*this, clock_, ready, start, end, what);
    DDP_CUDA_CHECK(cudaEventRecord(ready, backend_->stream()));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    // Numbered (and its queuing time taken) before its start is queued: the device may pass
    // an event on an idle stream before the host's next call.
    const uint64_t seq = ledger_.number({std::move(what), bytes, std::move(wire)});
    try {
      DDP_CUDA_CHECK(cudaEventRecord(start, stream_));
      issue();
    } catch (const Error&) {
      ledger_.failed(seq);
      throw;
    }
    DDP_CUDA_CHECK(cudaEventRecord(end, stream_));
    ledger_.queued(seq, end, work);
    work->set_seq(seq);
    return work;
  }

  // Each rank's part of a bucket of `count` floats, which must be equal for every rank.
  size_t equal_part(size_t count, const char* what) const {
    const size_t part = shard_part(count, size_, 0).numel;
    DDP_CHECK(part * static_cast<size_t>(size_) == count,
              "NCCL " << what << " of " << count << " floats: the bucket is not padded to " << size_
                      << " equal parts (pad_buckets_to_equal_parts)");
    return part;
  }

  // A call on a non-blocking communicator may return ncclInProgress while NCCL finishes
  // connecting; wait for that under the timeout, then check for errors.
  void settle(ncclResult_t rc, const std::string& what) {
    if (rc != ncclSuccess && rc != ncclInProgress) {
      const std::string detail = comm_ != nullptr ? ncclGetLastError(comm_) : "";
      note_if_peer_lost(rc);
      if (comm_ != nullptr) abort();
      DDP_THROW(what << " failed: " << ncclGetErrorString(rc)
                     << (detail.empty() ? "" : " (" + detail + ")"));
    }
    const double deadline = seconds_now() + timeout_s_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      DDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        const std::string detail = ncclGetLastError(comm_);
        note_if_peer_lost(state);
        abort();
        DDP_THROW(what << " failed: NCCL reports " << ncclGetErrorString(state)
                       << (detail.empty() ? "" : " (" + detail + ")"));
      }
      if (seconds_now() > deadline) {
        note_collective_timeout();
        abort();
        DDP_THROW(what << " did not complete within " << timeout_s_
                       << " s (distributed.timeout_s): a peer rank never joined");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // A peer that went away (NCCL's remote error: it exited, or the network between failed) is
  // what a restart on the ranks that remain can fix: main exits kExitPeerLost.
  static void note_if_peer_lost(ncclResult_t rc) {
    if (rc == ncclRemoteError) note_collective_timeout();
  }

  void abort() {
    if (!aborted_ && comm_ != nullptr) (void)ncclCommAbort(comm_);
    aborted_ = true;
  }

  // Whether everything queued on the NCCL stream finished by `deadline`: an event after it,
  // polled (cudaStreamSynchronize would wait for ever on a collective whose peer never posts).
  bool stream_drained_by(double deadline) {
    cudaEvent_t drained = nullptr;
    if (cudaEventCreateWithFlags(&drained, cudaEventDisableTiming) != cudaSuccess) return false;
    bool done = false;
    if (cudaEventRecord(drained, stream_) == cudaSuccess) {
      for (;;) {
        const cudaError_t state = cudaEventQuery(drained);
        if (state != cudaErrorNotReady) {
          done = state == cudaSuccess;
          break;
        }
        (void)cudaGetLastError();  // not ready is not an error
        if (seconds_now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    // An event still pending is released by the runtime once the stream passes it.
    (void)cudaEventDestroy(drained);
    return done;
  }

  cuda::CudaBackend* backend_ = nullptr;
  std::shared_ptr<cuda::EventClock> clock_;
  double timeout_s_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  int rank_ = 0, size_ = 1;
  DeviceArray<float> arena_;
  DeviceArray<float> parameters_;  // the sharded optimizer's parameter arena
  Compression format_ = Compression::None;
  DeviceArray<uint16_t> wire_;  // the gradient arena in format_, when compressed
  NcclFlightLedger ledger_;     // last: its pending Works go before the rest
};

NcclWork::~NcclWork() {
  clock_->give_back(ready_);
  clock_->give_back(start_);
  clock_->give_back(end_);
}

void NcclWork::wait() {
  owner_.check_async(what_);
  DDP_CUDA_CHECK(cudaStreamWaitEvent(owner_.compute_stream(), end_, 0));
}

void NcclWork::synchronize() {
  if (synchronized_) return;
  owner_.wait_event(end_, what_, seq_);
  start_seconds_ = clock_->seconds(start_);
  end_seconds_ = clock_->seconds(end_);
  owner_.device_times(seq_, start_seconds_, end_seconds_);
  synchronized_ = true;
}

void NcclFence::wait() { owner_.check_async(what_); }

void NcclFence::synchronize() {
  if (synchronized_) return;
  owner_.wait_event(end_, what_, seq_);
  synchronized_ = true;
}

}  // namespace

std::unique_ptr<ShardedCommunicator> make_nccl_communicator(ProcessGroup& group, Backend& backend,
                                                            const NcclOptions& options) {
  return std::make_unique<NcclCommunicator>(group, backend, options);
}

#endif  // DDP_WITH_NCCL

}  // namespace ddp
