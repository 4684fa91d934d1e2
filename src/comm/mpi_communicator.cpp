// MPI communicator: one communication thread per rank executes every MPI call in submission
// order, so async allreduces overlap the training thread's compute, and only one thread ever
// calls MPI (MPI_THREAD_SERIALIZED suffices).
#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <time.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "ddp/check.h"
#include "ddp/comm.h"

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
    thread_ = std::thread([this] { loop(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average) override {
    DDP_CHECK(count <= static_cast<size_t>(INT32_MAX),
              "allreduce of " << count << " floats is too large");
    return submit([this, data, count, average] {
      DDP_MPI_CHECK(
          MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_));
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
