// MPI communicator, the process group and the host gradient communicator in one: collectives
// run in submission order on the rank's communication lane (lane.h), so async allreduces overlap
// the training thread's compute, and only one thread at a time ever calls MPI
// (MPI_THREAD_SERIALIZED suffices). On one node, gradient buckets are summed straight out of
// each other's memory (node_window.h); the other collectives are non-blocking MPI calls
// completed by a bounded, core-yielding poll.
#include "comm/mpi/mpi_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/compression.h"
#include "comm/mpi/compressed_collectives.h"
#include "comm/mpi/lane.h"
#include "comm/mpi/node_window.h"
#include "comm/shard_plan.h"
#include "core/check.h"
#include "core/tensor.h"

namespace ddp {

namespace {

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// Host memory a polled MPI collective works in (a copy of the caller's). A collective whose wait
// gave up stays active, as MPI cannot cancel one, and a late peer's data would land in memory
// the caller has freed since: such a copy is kept until the process ends.
class CollectiveCopy {
 public:
  explicit CollectiveCopy(size_t bytes) : bytes_(new unsigned char[std::max<size_t>(1, bytes)]) {}
  unsigned char* data() { return bytes_.get(); }
  void keep_forever() {
    static std::mutex mu;
    static auto* kept = new std::vector<std::unique_ptr<unsigned char[]>>();  // never freed
    std::lock_guard<std::mutex> lock(mu);
    kept->push_back(std::move(bytes_));
  }

 private:
  std::unique_ptr<unsigned char[]> bytes_;
};

size_t type_bytes(MPI_Datatype type) {
  int size = 0;
  DDP_MPI_CHECK(MPI_Type_size(type, &size));
  return static_cast<size_t>(size);
}

// The average of a sum over `size` ranks.
void divide(float* data, size_t count, int size) {
  if (size == 1) return;
  const float inv = 1.0f / static_cast<float>(size);
  for (size_t i = 0; i < count; ++i) data[i] *= inv;
}

class LaneMpiCommunicator final : public MpiCommunicator {
 public:
  LaneMpiCommunicator(MPI_Comm comm, int ranks_per_node) : ranks_per_node_(ranks_per_node) {
    int provided = 0;
    DDP_MPI_CHECK(MPI_Query_thread(&provided));
    DDP_CHECK(provided >= MPI_THREAD_SERIALIZED,
              "MPI was initialised without thread support (MPI_THREAD_SERIALIZED needed for the "
              "communication lane)");
    DDP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    split_nodes(ranks_per_node);
    // More ranks than cores on this machine: a waiting rank spins on a core its peer needs.
    MPI_Comm machine = MPI_COMM_NULL;
    int machine_ranks = 1;
    DDP_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &machine));
    DDP_MPI_CHECK(MPI_Comm_size(machine, &machine_ranks));
    MPI_Comm_free(&machine);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const bool spin = cores <= 0 || machine_ranks <= cores;
    lane_ = std::make_unique<Lane>(spin);
    node_ = std::make_unique<NodeWindow>(win_comm_, *lane_, spin);
  }

  // The ranks of this rank's node (those sharing memory, or blocks of ranks_per_node when
  // given), the ranks of the same local rank on every node, and whether nodes are equal.
  void split_nodes(int ranks_per_node) {
    if (ranks_per_node > 0) {
      DDP_MPI_CHECK(MPI_Comm_split(comm_, rank_ / ranks_per_node, rank_, &node_comm_));
    } else {
      DDP_MPI_CHECK(
          MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm_));
    }
    DDP_MPI_CHECK(MPI_Comm_rank(node_comm_, &local_rank_));
    DDP_MPI_CHECK(MPI_Comm_size(node_comm_, &local_size_));
    DDP_MPI_CHECK(MPI_Comm_split(comm_, local_rank_, rank_, &cross_comm_));
    int sizes[2] = {local_size_, -local_size_};
    DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MIN, comm_));
    uniform_nodes_ = sizes[0] == -sizes[1];
    single_node_ = local_size_ == size_;
    // The shared-memory window spans the job on one node, a node when hierarchical.
    win_comm_ = single_node_ ? comm_ : node_comm_;
  }

  ~LaneMpiCommunicator() override {
    if (lane_->broken()) {
      // A collective was lost: MPI may still hold requests into the arena and the window, and
      // the lane's thread may be stuck in a blocking MPI call a peer never joined. The job is
      // about to be aborted: leave all of it to the end of the process.
      if (lane_->stop_broken()) lane_.release();
      new Buffer(std::move(arena_storage_));
      new Buffer(std::move(parameter_storage_));
      node_.release();
      return;
    }
    lane_.reset();  // runs what is queued, then joins its thread
    node_.reset();  // frees the windows (collective)
    for (MPI_Comm* c : {&node_comm_, &cross_comm_})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  float* gradient_arena(size_t numel, const BucketWire& wire) override {
    DDP_CHECK(arena_ == nullptr, "gradient_arena() called twice");
    configure(wire);
    if (!wire.shared_memory || !(single_node_ || hierarchical_) || size_ == 1 || numel == 0) {
      arena_storage_ = Buffer(numel);
      arena_ = arena_storage_.data();
      return arena_;
    }
    lane_
        ->submit(
            "allocation of the shared gradient arena",
            [this, numel] { arena_ = node_->allocate_gradients(numel); }, nullptr,
            /*any_thread=*/false)
        ->wait();
    return arena_;
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average) override {
    return allreduce_bucket(data, count, average, nullptr);
  }

  std::shared_ptr<Work> allreduce_on_lane(float* data, size_t count, bool average,
                                          const LaneHooks& hooks) override {
    return allreduce_bucket(data, count, average, &hooks);
  }

  // On the lane's thread like a bucket's MPI_Allreduce across nodes (the sums are blocking
  // MPI_Allreduce calls without a deadline), everything captured by value.
  std::shared_ptr<Work> reduce_on_lane(std::string what, size_t bytes, float* data, size_t count,
                                       BucketReduction reduce) override {
    MPI_Comm comm = comm_;
    const SumOverRanks sum = [comm](float* values, size_t n) {
      DDP_CHECK(n <= static_cast<size_t>(INT32_MAX), "a sum of " << n << " floats is too large");
      DDP_MPI_CHECK(
          MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm));
    };
    return lane_->submit(
        {std::move(what), bytes, "float32"},
        [data, count, sum, reduce = std::move(reduce)] { reduce(data, count, sum); }, nullptr,
        /*any_thread=*/false);
  }

  double* exact_sum_arena(size_t count, bool shared) override {
    DDP_CHECK(exact_ == nullptr, "exact_sum_arena() called twice");
    DDP_CHECK(count <= static_cast<size_t>(INT32_MAX),
              "an exact sum of " << count << " doubles is too large");
    exact_count_ = count;
    if (!shared || !single_node_ || size_ == 1 || count == 0) {
      exact_storage_.assign(count, 0.0);
      exact_ = exact_storage_.data();
      return exact_;
    }
    lane_
        ->submit(
            "allocation of the shared exact-sum array",
            [this, count] { exact_ = node_->allocate_exact(count); }, nullptr,
            /*any_thread=*/false)
        ->wait();
    return exact_;
  }

  // Across nodes Open MPI's blocking allreduce (its non-blocking one progresses only while
  // polled), on the lane's thread only, as a bucket across nodes: the waiter's timeout ends a
  // lost one. The array belongs to the communicator, so a lost call never writes freed memory.
  std::shared_ptr<Work> allreduce_exact_async(ExactConsumer consume) override {
    DDP_CHECK(exact_ != nullptr, "allreduce_exact_async() before exact_sum_arena()");
    Collective what{"exact allreduce of " + std::to_string(exact_count_) + " double(s)",
                    exact_count_ * sizeof(double), "float64"};
    if (node_->holds_exact(exact_)) {
      return lane_->submit(
          std::move(what),
          [this, consume = std::move(consume)] { node_->allreduce_exact(consume); }, nullptr,
          /*any_thread=*/true);
    }
    MPI_Comm comm = comm_;
    double* data = exact_;
    const size_t count = exact_count_;
    return lane_->submit(
        std::move(what),
        [comm, data, count, consume = std::move(consume)] {
          DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_DOUBLE,
                                      MPI_SUM, comm));
          consume(0, data, count);
        },
        nullptr, /*any_thread=*/false);
  }

  float* parameter_arena(size_t numel, bool shared) override {
    DDP_CHECK(parameters_ == nullptr, "parameter_arena() called twice");
    DDP_CHECK(!hierarchical_, "the sharded optimizer's collectives are not hierarchical");
    if (!shared || !single_node_ || size_ == 1 || numel == 0) {
      parameter_storage_ = Buffer(numel);
      parameters_ = parameter_storage_.data();
      return parameters_;
    }
    lane_
        ->submit(
            "allocation of the shared parameter arena",
            [this, numel] { parameters_ = node_->allocate_parameters(numel); }, nullptr,
            /*any_thread=*/false)
        ->wait();
    return parameters_;
  }

  std::shared_ptr<Work> reduce_scatter_async(float* data, size_t count) override {
    return reduce_scatter(data, count, nullptr);
  }

  std::shared_ptr<Work> reduce_scatter_into_async(float* data, size_t count,
                                                  PartConsumer consume) override {
    DDP_CHECK(consume, "reduce_scatter_into_async: no consumer");
    return reduce_scatter(data, count, std::move(consume));
  }

  std::shared_ptr<Work> allgather_async(float* arena, const std::vector<Span>& buckets) override {
    return allgather_with_riders(arena, buckets, {});
  }

  std::shared_ptr<Work> allgather_with_riders(float* arena, const std::vector<Span>& buckets,
                                              ScalarRiders riders) override {
    const size_t k = riders.mine.size();
    DDP_CHECK(k <= ScalarRiders::kMaxDoubles && (k == 0 || riders.all),
              "allgather: " << k << " riders (at most " << ScalarRiders::kMaxDoubles
                            << ", with room for every rank's)");
    if (k > 0) riders.all->resize(k * static_cast<size_t>(size_));
    size_t mine = 0;  // this rank's parts, what it contributes
    for (const Span& b : buckets) mine += shard_part(b.numel, size_, rank_).numel * sizeof(float);
    if (node_->holds_parameters(arena)) {
      // Every rank already reads every part in place: wait until each has written its own
      // (the riders pass through the control window's slots, on the same barrier).
      // The step waits for it at once: the lane's thread is not woken (see run_here).
      return lane_->submit(
          {"allgather of the parameters (shared memory)", mine, "float32"},
          [this, riders = std::move(riders), k] {
            node_->allgather(riders.mine.data(), k, k > 0 ? riders.all->data() : nullptr);
          },
          nullptr, /*any_thread=*/true, /*wake=*/false);
    }
    MPI_Comm comm = comm_;
    const int size = size_;
    return lane_->submit(
        {"allgather of the parameters", mine, "float32"},
        [comm, size, arena, buckets, riders = std::move(riders), k] {
          std::vector<int> counts(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
          for (const Span& b : buckets) {
            DDP_CHECK(b.numel <= static_cast<size_t>(INT32_MAX),
                      "allgather of " << b.numel << " floats is too large");
            for (int q = 0; q < size; ++q) {
              const Span part = shard_part(b.numel, size, q);
              counts[static_cast<size_t>(q)] = static_cast<int>(part.numel);
              offsets[static_cast<size_t>(q)] = static_cast<int>(part.offset);
            }
            DDP_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, arena + b.offset,
                                         counts.data(), offsets.data(), MPI_FLOAT, comm));
          }
          if (k == 0) return;
          DDP_MPI_CHECK(MPI_Allgather(riders.mine.data(), static_cast<int>(k), MPI_DOUBLE,
                                      riders.all->data(), static_cast<int>(k), MPI_DOUBLE, comm));
        },
        nullptr, /*any_thread=*/false);
  }

  void allreduce(double* data, size_t count, ReduceOp op) override {
    DDP_CHECK(count <= static_cast<size_t>(INT32_MAX),
              "allreduce of " << count << " doubles is too large");
    run_here({"allreduce of " + std::to_string(count) + " double(s)", count * sizeof(double),
              "float64"},
             [this, data, count, op] { polled_allreduce(data, count, MPI_DOUBLE, to_mpi(op)); });
  }

  void allgather(const double* mine, size_t count, double* all) override {
    DDP_CHECK(count <= static_cast<size_t>(INT32_MAX) / static_cast<size_t>(size_),
              "allgather of " << count << " doubles per rank is too large");
    Collective what{"allgather of " + std::to_string(count) + " double(s) per rank",
                    count * sizeof(double), "float64"};
    if (node_->has_barrier() && single_node_ && count <= NodeWindow::kSlotDoubles) {
      run_here(std::move(what), [this, mine, count, all] { node_->allgather(mine, count, all); });
      return;
    }
    run_here(std::move(what), [this, mine, count, all] {
      const size_t sent = count * sizeof(double), got = sent * static_cast<size_t>(size_);
      CollectiveCopy copy(sent + got);
      std::memcpy(copy.data(), mine, sent);
      MPI_Request request = MPI_REQUEST_NULL;
      DDP_MPI_CHECK(MPI_Iallgather(copy.data(), static_cast<int>(count), MPI_DOUBLE,
                                   copy.data() + sent, static_cast<int>(count), MPI_DOUBLE, comm_,
                                   &request));
      complete(request, copy);
      std::memcpy(all, copy.data() + sent, got);
    });
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op) override {
    DDP_CHECK(count <= static_cast<size_t>(INT32_MAX),
              "allreduce of " << count << " floats is too large");
    return lane_->submit(
        {"allreduce of " + std::to_string(count) + " floats", count * sizeof(float), "float32"},
        [this, data, count, op] { polled_allreduce(data, count, MPI_FLOAT, to_mpi(op)); });
  }

  void broadcast(void* data, size_t bytes, int root) override {
    DDP_CHECK(bytes <= static_cast<size_t>(INT32_MAX),
              "broadcast of " << bytes << " bytes is too large");
    run_here(
        {"broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root),
         bytes, "bytes"},
        [this, data, bytes, root] {
          CollectiveCopy copy(bytes);
          std::memcpy(copy.data(), data, bytes);
          MPI_Request request = MPI_REQUEST_NULL;
          DDP_MPI_CHECK(
              MPI_Ibcast(copy.data(), static_cast<int>(bytes), MPI_BYTE, root, comm_, &request));
          complete(request, copy);
          std::memcpy(data, copy.data(), bytes);
        });
  }

  void gather(const void* mine, size_t bytes, void* all, int root) override {
    const size_t total = rank_ == root ? bytes * static_cast<size_t>(size_) : 0;
    DDP_CHECK(bytes <= static_cast<size_t>(INT32_MAX),
              "gather of " << bytes << " bytes a rank is too large");
    run_here(
        {"gather of " + std::to_string(bytes) + " bytes a rank to rank " + std::to_string(root),
         bytes, "bytes"},
        [this, mine, bytes, all, root, total] {
          CollectiveCopy copy(bytes + total);
          std::memcpy(copy.data(), mine, bytes);
          MPI_Request request = MPI_REQUEST_NULL;
          DDP_MPI_CHECK(MPI_Igather(copy.data(), static_cast<int>(bytes), MPI_BYTE,
                                    copy.data() + bytes, static_cast<int>(bytes), MPI_BYTE, root,
                                    comm_, &request));
          complete(request, copy);
          if (total > 0) std::memcpy(all, copy.data() + bytes, total);
        });
  }

  void scatter(const void* all, size_t bytes, void* mine, int root) override {
    const size_t total = rank_ == root ? bytes * static_cast<size_t>(size_) : 0;
    DDP_CHECK(bytes <= static_cast<size_t>(INT32_MAX),
              "scatter of " << bytes << " bytes a rank is too large");
    run_here(
        {"scatter of " + std::to_string(bytes) + " bytes a rank from rank " + std::to_string(root),
         bytes, "bytes"},
        [this, all, bytes, mine, root, total] {
          CollectiveCopy copy(bytes + total);
          if (total > 0) std::memcpy(copy.data() + bytes, all, total);
          MPI_Request request = MPI_REQUEST_NULL;
          DDP_MPI_CHECK(MPI_Iscatter(copy.data() + bytes, static_cast<int>(bytes), MPI_BYTE,
                                     copy.data(), static_cast<int>(bytes), MPI_BYTE, root, comm_,
                                     &request));
          complete(request, copy);
          std::memcpy(mine, copy.data(), bytes);
        });
  }

  void barrier() override {
    run_here("barrier", [this] {
      CollectiveCopy none(0);
      MPI_Request request = MPI_REQUEST_NULL;
      DDP_MPI_CHECK(MPI_Ibarrier(comm_, &request));
      complete(request, none);
    });
  }

  void set_timeout(double seconds) override {
    DDP_CHECK(seconds > 0, "communicator timeout must be > 0 s, got " << seconds);
    lane_->set_timeout(seconds);
  }
  double timeout() const override { return lane_->timeout(); }

  void set_flight_recorder(std::shared_ptr<FlightRecorder> recorder) override {
    lane_->set_recorder(std::move(recorder));
  }

  std::unique_ptr<MpiCommunicator> duplicate() override {
    return std::make_unique<LaneMpiCommunicator>(comm_, ranks_per_node_);
  }

 private:
  // A gradient bucket's allreduce, with the staged communicator's hooks or none.
  std::shared_ptr<Work> allreduce_bucket(float* data, size_t count, bool average,
                                         const LaneHooks* hooks) {
    DDP_CHECK(count <= static_cast<size_t>(INT32_MAX),
              "allreduce of " << count << " floats is too large");
    Collective what{"allreduce of " + std::to_string(count) + " floats", count * sizeof(float),
                    wire_name()};
    if (node_->holds_gradients(data, count)) {
      // Across nodes (hierarchical) each rank's chunk takes a blocking MPI call: on the lane's
      // thread only, like any bucket across nodes.
      const size_t offset = node_->offset_of(data);
      return lane_->submit(
          std::move(what),
          [this, offset, count, average] {
            node_->allreduce(offset, count, across_nodes());
            if (average) scale(arena_ + offset, count);
          },
          hooks, /*any_thread=*/!hierarchical_);
    }
    if (format_ != Compression::None)
      return compressed_allreduce_async(data, count, average, hooks);
    if (count <= kPolledFloats) {
      return lane_->submit(
          std::move(what),
          [this, data, count, average] {
            polled_allreduce(data, count, MPI_FLOAT, MPI_SUM);
            if (average) scale(data, count);
          },
          hooks);
    }
    // A gradient bucket across nodes: Open MPI's blocking allreduce picks the algorithm for the
    // message size (its non-blocking one progresses only while polled). It has no deadline, so
    // only the lane's thread runs it and a waiter's timeout is what ends a lost one. Everything
    // it uses is captured by value: a lost call may return after the communicator is gone.
    MPI_Comm comm = comm_;
    const int size = size_;
    return lane_->submit(
        std::move(what),
        [comm, size, data, count, average] {
          DDP_MPI_CHECK(
              MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm));
          if (average) divide(data, count, size);
        },
        hooks, /*any_thread=*/false);
  }

  // The wire of the gradient buckets, before the arena exists (gradient_arena).
  // The gradient path asks for a hierarchy only across equal nodes of several ranks each.
  void configure(const BucketWire& wire) {
    format_ = wire.format;
    sum_ = wire.sum;
    on_node_ = wire.on_node;
    node_->set_rounding(node_format(), sum_);
    DDP_CHECK(!wire.hierarchical || uniform_nodes_,
              "distributed.hierarchical: needs the same number of ranks on every node (rank "
                  << rank_ << "'s node has " << local_size_ << " of the job's " << size_ << ")");
    DDP_CHECK(!wire.hierarchical || (!single_node_ && local_size_ > 1),
              "distributed.hierarchical: needs several nodes of more than one rank each (rank "
                  << rank_ << "'s node has " << local_size_ << " of the job's " << size_ << ")");
    hierarchical_ = wire.hierarchical;
  }

  // The reduce-scatter of a bucket, its sum stored in this rank's part or handed to `consume`.
  std::shared_ptr<Work> reduce_scatter(float* data, size_t count, PartConsumer consume) {
    DDP_CHECK(count <= static_cast<size_t>(INT32_MAX),
              "reduce-scatter of " << count << " floats is too large");
    Collective what{std::string(consume ? "reduce-scatter + update" : "reduce-scatter") + " of " +
                        std::to_string(count) + " floats",
                    count * sizeof(float), wire_name()};
    if (node_->holds_gradients(data, count)) {
      const size_t offset = node_->offset_of(data);
      return lane_->submit(std::move(what), [this, offset, count, consume = std::move(consume)] {
        node_->reduce_scatter(offset, count, shard_part(count, size_, rank_), consume);
      });
    }
    // Across nodes: MPI, on the lane's thread only, like a bucket's allreduce. Captured by
    // value: a lost call may return after the communicator is gone.
    MPI_Comm comm = comm_;
    const int size = size_, rank = rank_;
    const Compression format = format_;
    const CompressedSum sum = sum_;
    if (format != Compression::None)
      what.what = std::string("compressed ") + to_string(format) + " " + what.what;
    return lane_->submit(
        std::move(what),
        [comm, size, rank, data, count, format, sum, scratch = scratch_, compressed = compressed_,
         consume = std::move(consume)] {
          if (format != Compression::None) {
            compressed_reduce_scatter(comm, data, count, format, sum, *compressed);
          } else {
            summed_reduce_scatter(comm, size, rank, data, count, *scratch);
          }
          const Span mine = shard_part(count, size, rank);
          if (consume && mine.numel > 0)
            consume(data + mine.offset, data + mine.offset, mine.numel);
        },
        nullptr, /*any_thread=*/false);
  }

  // Across nodes: every rank sends each part of the bucket to its owner (MPI_Alltoallv), which
  // sums what it receives in rank order: the shared-memory path's sums, bitwise, on any layout
  // of ranks over nodes, with the (N-1)/N of the bucket per rank on the link that a ring
  // reduce-scatter sends. `received` is the communicator's, reused (the lane runs one
  // collective at a time), not allocated per call.
  static void summed_reduce_scatter(MPI_Comm comm, int size, int rank, float* data, size_t count,
                                    std::vector<float>& received) {
    const Span mine = shard_part(count, size, rank);
    const size_t n = static_cast<size_t>(size);
    std::vector<int> send_counts(n), send_offsets(n), recv_counts(n), recv_offsets(n);
    for (size_t q = 0; q < n; ++q) {
      const Span part = shard_part(count, size, static_cast<int>(q));
      send_counts[q] = static_cast<int>(part.numel);
      send_offsets[q] = static_cast<int>(part.offset);
      recv_counts[q] = static_cast<int>(mine.numel);
      recv_offsets[q] = static_cast<int>(q * mine.numel);
    }
    if (received.size() < std::max<size_t>(n * mine.numel, 1))
      received.resize(std::max<size_t>(n * mine.numel, 1));
    DDP_MPI_CHECK(MPI_Alltoallv(data, send_counts.data(), send_offsets.data(), MPI_FLOAT,
                                received.data(), recv_counts.data(), recv_offsets.data(), MPI_FLOAT,
                                comm));
    float* out = data + mine.offset;
    std::copy(received.data(), received.data() + mine.numel, out);
    for (size_t q = 1; q < n; ++q) {
      const float* from = received.data() + q * mine.numel;
      for (size_t i = 0; i < mine.numel; ++i) out[i] += from[i];
    }
  }

  // A blocking collective: queued behind the others and waited for at once, so the lane's
  // thread is not woken for it (this thread runs it when the lane is idle).
  void run_here(Collective what, std::function<void()> fn) {
    lane_->submit(std::move(what), std::move(fn), nullptr, /*any_thread=*/true, /*wake=*/false)
        ->wait();
  }

  // A gradient bucket across nodes in 16 bits (compressed_collectives.h), on the lane's thread
  // like the float32 MPI_Allreduce it replaces, everything captured by value.
  std::shared_ptr<Work> compressed_allreduce_async(float* data, size_t count, bool average,
                                                   const LaneHooks* hooks) {
    MPI_Comm comm = comm_;
    const int size = size_;
    const Compression format = format_;
    const CompressedSum sum = sum_;
    return lane_->submit(
        {std::string("compressed ") + to_string(format) + " allreduce of " + std::to_string(count) +
             " floats",
         count * sizeof(float), to_string(format)},
        [comm, size, data, count, average, format, sum, scratch = compressed_] {
          compressed_allreduce(comm, data, count, format, sum, *scratch);
          if (average) divide(data, count, size);
        },
        hooks, /*any_thread=*/false);
  }

  // The type gradient buckets travel as (across nodes; on one node unless compression_on_node
  // the shared-memory path sums float32).
  std::string wire_name() const {
    return format_ == Compression::None ? "float32" : to_string(format_);
  }

  // Whether the shared-memory path rounds to the compressed format (compression_on_node).
  Compression node_format() const { return on_node_ ? format_ : Compression::None; }

  // Allreduces of host memory up to this size (stop flags, metrics) are polled like the control
  // collectives; larger ones are gradient buckets across nodes.
  static constexpr size_t kPolledFloats = 1024;

  void scale(float* data, size_t count) const { divide(data, count, size_); }

  // An MPI_Iallreduce of host memory, in place in a copy, completed by polling.
  void polled_allreduce(void* data, size_t count, MPI_Datatype type, MPI_Op op) {
    const size_t bytes = count * type_bytes(type);
    CollectiveCopy copy(bytes);
    std::memcpy(copy.data(), data, bytes);
    MPI_Request request = MPI_REQUEST_NULL;
    DDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, copy.data(), static_cast<int>(count), type, op,
                                 comm_, &request));
    complete(request, copy);
    std::memcpy(data, copy.data(), bytes);
  }

  // Completes a non-blocking MPI call on `copy` by polling it (each MPI_Test also progresses
  // MPI), within the lane's deadline and yielding the core while the peers are late. A call it
  // gives up on keeps its copy for good.
  void complete(MPI_Request& request, CollectiveCopy& copy) {
    try {
      lane_->wait_until([&request] {
        int flag = 0;
        DDP_MPI_CHECK(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
        return flag != 0;
      });
    } catch (...) {
      if (request != MPI_REQUEST_NULL) copy.keep_forever();
      throw;
    }
  }

  // Hierarchical: the allreduce of a rank's chunk, summed over its node, with the same chunk of
  // every other node (the ranks of the same local rank), in 16 bits with compression. None on
  // one node. It captures only `this`, so building it per bucket allocates nothing.
  std::function<void(float*, size_t)> across_nodes() {
    if (!hierarchical_) return nullptr;
    return [this](float* chunk, size_t count) { allreduce_across_nodes(chunk, count); };
  }

  void allreduce_across_nodes(float* chunk, size_t count) {
    if (format_ != Compression::None) {
      compressed_allreduce(cross_comm_, chunk, count, format_, sum_, *compressed_);
      return;
    }
    DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, chunk, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                                cross_comm_));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm node_comm_ = MPI_COMM_NULL;   // this rank's node
  MPI_Comm cross_comm_ = MPI_COMM_NULL;  // this local rank on every node
  bool single_node_ = false;
  bool uniform_nodes_ = false;  // every node has local_size_ ranks
  bool hierarchical_ =
      false;  // BucketWire::hierarchical, across nodes with more than one rank each
  // The shared memory's ranks: the job on one node, this node when hierarchical.
  MPI_Comm win_comm_ = MPI_COMM_NULL;
  std::unique_ptr<NodeWindow> node_;  // the shared-memory windows (empty until an arena is)
  float* arena_ = nullptr;            // the gradient arena
  Buffer arena_storage_;              // the arena when there is no shared window
  double* exact_ = nullptr;           // exact_sum_arena(): the node window's, or exact_storage_
  size_t exact_count_ = 0;
  std::vector<double> exact_storage_;
  float* parameters_ = nullptr;       // the parameter arena (sharded optimizer)
  Buffer parameter_storage_;          // the parameter arena when there is no shared window
  // What the reduce-scatter across nodes receives (shared with its calls, see there).
  std::shared_ptr<std::vector<float>> scratch_ = std::make_shared<std::vector<float>>();
  // distributed.compression (BucketWire::format) and the 16-bit buffers of its collectives.
  Compression format_ = Compression::None;
  CompressedSum sum_ = CompressedSum::Wire;  // BucketWire::sum
  bool on_node_ = false;
  std::shared_ptr<CompressedScratch> compressed_ = std::make_shared<CompressedScratch>();
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  int ranks_per_node_ = 0;  // as constructed: what duplicate() passes on
  std::unique_ptr<Lane> lane_;  // last: its thread runs collectives that use the members above
};

}  // namespace

std::unique_ptr<MpiCommunicator> make_mpi_communicator(MPI_Comm comm, int ranks_per_node) {
  return std::make_unique<LaneMpiCommunicator>(comm, ranks_per_node);
}

}  // namespace ddp
