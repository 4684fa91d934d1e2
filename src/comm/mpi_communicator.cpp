// MPI communicator: one communication thread per rank executes every MPI call in submission
// order, so async allreduces overlap the training thread's compute, and only one thread ever
// calls MPI (MPI_THREAD_SERIALIZED suffices).
#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/check.h"
#include "ddp/comm.h"
#include "ddp/tensor.h"

namespace ddp {

namespace {

// What every piece of work on the lane shares: how long a wait may take, and the flag a wait
// that gave up raises (the communicator is then broken: its lane is stuck in MPI).
struct LaneState {
  std::atomic<double> timeout_s{600.0};
  std::atomic<bool> broken{false};
};

class MpiWork : public Work {
 public:
  MpiWork(std::shared_ptr<LaneState> lane, std::string what)
      : lane_(std::move(lane)), what_(std::move(what)) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    const double timeout = lane_->timeout_s.load();
    if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout), [&] { return done_; })) {
      lane_->broken = true;
      DDP_THROW(what_ << " did not complete within " << timeout
                      << " s (distributed.timeout_s): a peer rank died, stalled or "
                         "stopped on an error");
    }
    if (error_) std::rethrow_exception(error_);
  }
  double start_time() const override { return start_; }
  double end_time() const override { return end_; }

  void run(const std::function<void()>& fn, const LaneHooks* hooks) {
    std::exception_ptr error;
    try {
      if (hooks != nullptr && hooks->ready) hooks->ready();
      start_ = seconds_now();
      if (hooks != nullptr && hooks->before) hooks->before();
      fn();
      if (hooks != nullptr && hooks->after) hooks->after();
    } catch (...) {
      error = std::current_exception();
    }
    if (start_ == 0.0) start_ = seconds_now();
    end_ = seconds_now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = error;
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::shared_ptr<LaneState> lane_;
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  double start_ = 0.0, end_ = 0.0;
};

// The comm thread yields the core to computation. Where a rank has a core to itself the
// training thread and this one share it: Open MPI busy-polls while waiting for a peer, and at
// equal priority that polling takes turns with backward; at the lowest priority it runs when
// backward does not need the core (Linux gives each thread its own nice value). Where spare
// cores exist the thread simply runs on one of them.
void lower_thread_priority() {
#if defined(__linux__)
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
#endif
}

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

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) {
    int provided = 0;
    DDP_MPI_CHECK(MPI_Query_thread(&provided));
    DDP_CHECK(provided >= MPI_THREAD_SERIALIZED,
              "MPI was initialised without thread support (MPI_THREAD_SERIALIZED needed for the "
              "communication thread)");
    DDP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_Comm node = MPI_COMM_NULL;
    DDP_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    DDP_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    DDP_MPI_CHECK(MPI_Comm_size(node, &local_size_));
    MPI_Comm_free(&node);
    single_node_ = local_size_ == size_;
    thread_ = std::thread([this] { loop(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (lane_->broken) {
      // The lane is stuck inside MPI on a collective a peer never joined: joining would hang,
      // and freeing what that call uses would let it write into freed memory should it ever
      // return. The job is about to be aborted; leave both to the end of the process.
      thread_.detach();
      new Buffer(std::move(arena_storage_));
      return;
    }
    thread_.join();
    if (window_ != MPI_WIN_NULL) {
      MPI_Win_unlock_all(window_);
      MPI_Win_free(&window_);
    }
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  float* gradient_arena(size_t numel, bool shared) override {
    DDP_CHECK(arena_ == nullptr && window_ == MPI_WIN_NULL, "gradient_arena() called twice");
    if (!shared || !single_node_ || size_ == 1 || numel == 0) {
      arena_storage_ = Buffer(numel);
      arena_ = arena_storage_.data();
      return arena_;
    }
    submit("allocation of the shared gradient arena", nullptr, [this, numel] {
      allocate_window(numel);
    })->wait();
    return arena_;
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average,
                                        const LaneHooks* hooks) override {
    DDP_CHECK(count <= static_cast<size_t>(INT32_MAX),
              "allreduce of " << count << " floats is too large");
    const bool shared =
        window_ != MPI_WIN_NULL && data >= arena_ && data + count <= arena_ + arena_numel_;
    return submit("allreduce of " + std::to_string(count) + " floats", hooks,
                  [this, data, count, average, shared] {
                    if (shared) {
                      shared_memory_allreduce(static_cast<size_t>(data - arena_), count);
                    } else {
                      DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count),
                                                  MPI_FLOAT, MPI_SUM, comm_));
                    }
                    if (average && size_ > 1) {
                      const float inv = 1.0f / static_cast<float>(size_);
                      for (size_t i = 0; i < count; ++i) data[i] *= inv;
                    }
                  });
  }

  void allreduce(double* data, size_t count, ReduceOp op) override {
    submit("allreduce of " + std::to_string(count) + " double(s)", nullptr,
           [this, data, count, op] {
             DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_DOUBLE,
                                         to_mpi(op), comm_));
           })
        ->wait();
  }

  void broadcast(void* data, size_t bytes, int root) override {
    DDP_CHECK(bytes <= static_cast<size_t>(INT32_MAX),
              "broadcast of " << bytes << " bytes is too large");
    submit("broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root),
           nullptr,
           [this, data, bytes, root] {
             DDP_MPI_CHECK(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_));
           })
        ->wait();
  }

  void barrier() override {
    submit("barrier", nullptr, [this] { DDP_MPI_CHECK(MPI_Barrier(comm_)); })->wait();
  }

  void set_timeout(double seconds) override {
    DDP_CHECK(seconds > 0, "communicator timeout must be > 0 s, got " << seconds);
    lane_->timeout_s = seconds;
  }
  double timeout() const override { return lane_->timeout_s.load(); }

 private:
  struct Task {
    std::shared_ptr<MpiWork> work;
    std::function<void()> fn;
    LaneHooks hooks;
    bool has_hooks = false;
  };

  std::shared_ptr<Work> submit(std::string what, const LaneHooks* hooks, std::function<void()> fn) {
    DDP_CHECK(!lane_->broken, what << " refused: an earlier collective timed out and the "
                                      "communication lane is stuck");
    auto work = std::make_shared<MpiWork>(lane_, std::move(what));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(Task{work, std::move(fn), hooks ? *hooks : LaneHooks{}, hooks != nullptr});
    }
    cv_.notify_one();
    return work;
  }

  // One shared window holds every rank's gradient arena; each rank knows where its peers'
  // arenas are mapped, so a bucket's allreduce is a reduce-scatter and an allgather done with
  // loads and stores, with no copy through MPI's buffers.
  void allocate_window(size_t numel) {
    void* base = nullptr;
    const MPI_Aint bytes = static_cast<MPI_Aint>(numel * sizeof(float));
    DDP_MPI_CHECK(
        MPI_Win_allocate_shared(bytes, sizeof(float), MPI_INFO_NULL, comm_, &base, &window_));
    DDP_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_));
    peers_.resize(static_cast<size_t>(size_));
    for (int q = 0; q < size_; ++q) {
      MPI_Aint peer_bytes = 0;
      int disp = 0;
      void* peer = nullptr;
      DDP_MPI_CHECK(MPI_Win_shared_query(window_, q, &peer_bytes, &disp, &peer));
      DDP_CHECK(static_cast<size_t>(peer_bytes) == numel * sizeof(float),
                "rank " << q << "'s gradient arena holds " << peer_bytes << " bytes, this rank's "
                        << numel * sizeof(float));
      peers_[static_cast<size_t>(q)] = static_cast<float*>(peer);
    }
    arena_ = static_cast<float*>(base);
    arena_numel_ = numel;
    std::fill(arena_, arena_ + numel, 0.0f);
    sync_all();
  }

  // Makes every rank's stores visible to every other rank, then waits for all of them.
  void sync_all() {
    DDP_MPI_CHECK(MPI_Win_sync(window_));
    DDP_MPI_CHECK(MPI_Barrier(comm_));
    DDP_MPI_CHECK(MPI_Win_sync(window_));
  }

  // Sum of [offset, offset + count) over all ranks' arenas, into every rank's arena. Rank r sums
  // chunk r (in rank order 0..N-1, so the result is the same bits on every rank and every run)
  // into its own arena; then every rank copies the other chunks from their owners.
  void shared_memory_allreduce(size_t offset, size_t count) {
    const size_t n = static_cast<size_t>(size_);
    const size_t chunk = (count + n - 1) / n;
    auto range = [&](size_t q) {
      const size_t lo = std::min(count, q * chunk);
      return std::make_pair(lo, std::min(count, lo + chunk));
    };
    sync_all();  // every rank's bucket is written
    const auto [lo, hi] = range(static_cast<size_t>(rank_));
    float* mine = peers_[static_cast<size_t>(rank_)] + offset;
    constexpr size_t kBlock = 1024;
    float acc[kBlock];
    for (size_t b = lo; b < hi; b += kBlock) {
      const size_t len = std::min(kBlock, hi - b);
      const float* first = peers_[0] + offset + b;
      std::copy(first, first + len, acc);
      for (size_t q = 1; q < n; ++q) {
        const float* src = peers_[q] + offset + b;
        for (size_t i = 0; i < len; ++i) acc[i] += src[i];
      }
      std::copy(acc, acc + len, mine + b);
    }
    sync_all();  // every chunk is reduced
    for (size_t q = 0; q < n; ++q) {
      if (q == static_cast<size_t>(rank_)) continue;
      const auto [qlo, qhi] = range(q);
      std::copy(peers_[q] + offset + qlo, peers_[q] + offset + qhi, mine + qlo);
    }
    sync_all();  // nobody reads this bucket any more: backward may overwrite it
  }

  void loop() {
    lower_thread_priority();
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop requested and nothing left to run
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task.work->run(task.fn, task.has_hooks ? &task.hooks : nullptr);
    }
  }

  std::shared_ptr<LaneState> lane_ = std::make_shared<LaneState>();
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool single_node_ = false;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<float*> peers_;  // every rank's arena, mapped here
  float* arena_ = nullptr;
  size_t arena_numel_ = 0;
  Buffer arena_storage_;  // the arena when there is no shared window
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  return std::make_unique<MpiCommunicator>(comm);
}

std::string broadcast_string(Communicator& comm, const std::string& s, int root) {
  uint64_t n = s.size();
  comm.broadcast(&n, sizeof(n), root);
  std::string out = comm.rank() == root ? s : std::string(n, '\0');
  if (n > 0) comm.broadcast(out.data(), n, root);
  return out;
}

}  // namespace ddp
