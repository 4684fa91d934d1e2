// MPI communicator: one communication thread per rank executes every MPI call in submission
// order, so async allreduces overlap the training thread's compute, and only one thread ever
// calls MPI (MPI_THREAD_SERIALIZED suffices).
#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <time.h>

#include <algorithm>
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

double seconds_now() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

namespace {

class MpiWork : public Work {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  double start_time() const override { return start_; }
  double end_time() const override { return end_; }

  void run(const std::function<void()>& fn) {
    start_ = seconds_now();
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    end_ = seconds_now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = error;
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
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
    int node_size = 0;
    DDP_MPI_CHECK(MPI_Comm_size(node, &node_size));
    MPI_Comm_free(&node);
    single_node_ = node_size == size_;
    thread_ = std::thread([this] { loop(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (window_ != MPI_WIN_NULL) {
      MPI_Win_unlock_all(window_);
      MPI_Win_free(&window_);
    }
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  float* gradient_arena(size_t numel, bool shared) override {
    DDP_CHECK(arena_ == nullptr && window_ == MPI_WIN_NULL, "gradient_arena() called twice");
    if (!shared || !single_node_ || size_ == 1 || numel == 0) {
      arena_storage_ = Buffer(numel);
      arena_ = arena_storage_.data();
      return arena_;
    }
    submit([this, numel] { allocate_window(numel); })->wait();
    return arena_;
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average) override {
    DDP_CHECK(count <= static_cast<size_t>(INT32_MAX),
              "allreduce of " << count << " floats is too large");
    const bool shared =
        window_ != MPI_WIN_NULL && data >= arena_ && data + count <= arena_ + arena_numel_;
    return submit([this, data, count, average, shared] {
      if (shared) {
        shared_memory_allreduce(static_cast<size_t>(data - arena_), count);
      } else {
        DDP_MPI_CHECK(
            MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_));
      }
      if (average && size_ > 1) {
        const float inv = 1.0f / static_cast<float>(size_);
        for (size_t i = 0; i < count; ++i) data[i] *= inv;
      }
    });
  }

  void allreduce(double* data, size_t count, ReduceOp op) override {
    submit([this, data, count, op] {
      DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_DOUBLE,
                                  to_mpi(op), comm_));
    })->wait();
  }

  void broadcast(void* data, size_t bytes, int root) override {
    DDP_CHECK(bytes <= static_cast<size_t>(INT32_MAX),
              "broadcast of " << bytes << " bytes is too large");
    submit([this, data, bytes, root] {
      DDP_MPI_CHECK(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_));
    })->wait();
  }

  void barrier() override {
    submit([this] { DDP_MPI_CHECK(MPI_Barrier(comm_)); })->wait();
  }

 private:
  struct Task {
    std::shared_ptr<MpiWork> work;
    std::function<void()> fn;
  };

  std::shared_ptr<Work> submit(std::function<void()> fn) {
    auto work = std::make_shared<MpiWork>();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(Task{work, std::move(fn)});
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
      task.work->run(task.fn);
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool single_node_ = false;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<float*> peers_;  // every rank's arena, mapped here
  float* arena_ = nullptr;
  size_t arena_numel_ = 0;
  Buffer arena_storage_;  // the arena when there is no shared window
  int rank_ = 0, size_ = 1;
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
