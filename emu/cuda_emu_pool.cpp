// The worker pool that runs a launch: one worker thread per thread of the block, each running its
// thread of every block in turn; the shared arrays, poisoned before each block; and
// execute_launch, which sets a checked launch up and runs it.
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <typeinfo>
#include <utility>
#include <vector>

#include "cuda_emu_internal.h"

thread_local uint3 threadIdx{0, 0, 0};
thread_local uint3 blockIdx{0, 0, 0};
thread_local dim3 blockDim{};
thread_local dim3 gridDim{};

namespace ddp_emu {
namespace {

// ----- shared arrays --------------------------------------------------------------------------

struct SharedArrays {
  std::mutex mu;
  std::vector<std::pair<void*, size_t>> arrays;
};

SharedArrays& shared_arrays() {
  static SharedArrays* arrays = new SharedArrays;  // never destroyed: launches may outlive main
  return *arrays;
}

// All-ones bytes in every registered shared array (DDP_EMU_SHARED): called before each block,
// while no thread of the launch runs.
void poison_shared_arrays() {
  SharedArrays& a = shared_arrays();
  std::lock_guard<std::mutex> lk(a.mu);
  for (const auto& [p, n] : a.arrays) std::memset(p, 0xFF, n);
}

// ----- the worker pool ------------------------------------------------------------------------

// Runs the kernel for the calling thread; false when the launch is failing.
bool run_body(Launch& l, unsigned tid) {
  try {
    wait_turn(l, tid);
    l.args->run();
    return true;
  } catch (const AbortBlock&) {
  } catch (const std::exception& e) {
    const std::string type = demangle(abi::__cxa_current_exception_type()->name());
    std::lock_guard<std::mutex> lk(l.mu);
    fail_locked(l, "threw " + type + ": " + e.what());
  } catch (...) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    std::lock_guard<std::mutex> lk(l.mu);
    fail_locked(l, "threw an exception of type " + (t ? demangle(t->name()) : std::string("?")));
  }
  return false;
}

// The calling thread returned from the kernel: waits for the rest of its block. False: stop.
bool finish_block(Launch& l, const ThreadCtx& c) {
  std::unique_lock<std::mutex> lk(l.mu);
  if (is_aborted(l)) return false;
  ++l.exited;
  Warp& w = l.warps[c.warp];
  const unsigned me = 1u << c.lane;
  w.exited |= me;
  if (l.waiting > 0) {
    fail_locked(l, "returned from the kernel while " + std::to_string(l.waiting) +
                       " thread(s) of the block wait at __syncthreads() at " +
                       site(l.barrier_file, l.barrier_line) +
                       " (every thread must reach every __syncthreads())");
    return false;
  }
  for (const WarpGroup& g : w.groups) {
    if (g.mask & me) {
      fail_locked(l, "returned from the kernel while lanes " + hex32(g.arrived) + " of warp " +
                         std::to_string(c.warp) + " wait at " + op_name(g.op) + " at " +
                         site(g.file, g.line) + " with mask " + hex32(g.mask) +
                         " that includes lane " + std::to_string(c.lane));
      return false;
    }
  }
  if (l.exited == l.threads) {
    l.reset_block_locked();
    poison_shared_arrays();
    start_block_locked(l);  // the next block's first thread (none runs if this was the last)
    l.block_end.bump();
    lk.unlock();
    l.block_end.wake();
    return true;
  }
  if (l.blocked > 0 && l.blocked + l.exited == l.threads) {
    fail_locked(l, "returned from the kernel, leaving the block deadlocked: " + waits_locked(l));
    return false;
  }
  const uint32_t seen = l.block_end.value();
  if (l.serial()) pass_turn_locked(l);
  lk.unlock();
  l.block_end.wait_change(seen);
  return !is_aborted(l);
}

uint3 unflatten(uint64_t i, dim3 d) {
  return uint3{static_cast<unsigned>(i % d.x), static_cast<unsigned>(i / d.x % d.y),
               static_cast<unsigned>(i / d.x / d.y)};
}

void run_thread(Launch& l, unsigned tid) {
  threadIdx = unflatten(tid, l.block);
  blockDim = l.block;
  gridDim = l.grid;
  ThreadCtx c{&l, tid, tid % 32, tid / 32};
  g_ctx = &c;
  for (uint64_t b = 0; b < l.blocks; ++b) {
    blockIdx = unflatten(b, l.grid);
    if (!run_body(l, tid) || !finish_block(l, c)) break;
  }
  g_ctx = nullptr;
}

class Pool {
 public:
  static Pool& instance() {
    static Pool pool;
    return pool;
  }

  ~Pool() {
    for (auto& w : workers_) {
      {
        std::lock_guard<std::mutex> lk(w->mu);
        w->stop = true;
      }
      w->cv.notify_one();
    }
    for (auto& w : workers_) w->thread.join();
  }

  int size() {
    std::lock_guard<std::mutex> lk(done_mu_);
    return static_cast<int>(workers_.size());
  }

  // Runs l on its first l.threads workers and returns when all of them are done.
  void run(Launch& l) {
    grow(l.threads);
    {
      std::lock_guard<std::mutex> lk(done_mu_);
      job_ = &l;
      remaining_ = l.threads;
    }
    for (unsigned i = 0; i < l.threads; ++i) {
      Worker& w = *workers_[i];
      {
        std::lock_guard<std::mutex> lk(w.mu);
        ++w.jobs;
      }
      w.cv.notify_one();
    }
    std::unique_lock<std::mutex> lk(done_mu_);
    done_cv_.wait(lk, [&] { return remaining_ == 0; });
    job_ = nullptr;
  }

 private:
  struct Worker {
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t jobs = 0;
    bool stop = false;
  };

  void grow(unsigned n) {
    while (workers_.size() < n) {
      auto w = std::make_unique<Worker>();
      const unsigned index = static_cast<unsigned>(workers_.size());
      Worker* raw = w.get();
      try {
        w->thread = std::thread([this, raw, index] { worker_main(*raw, index); });
      } catch (const std::system_error& e) {
        throw KernelFault(std::string("cannot start emulator worker threads: ") + e.what());
      }
      std::lock_guard<std::mutex> lk(done_mu_);
      workers_.push_back(std::move(w));
    }
  }

  void worker_main(Worker& w, unsigned index) {
    uint64_t seen = 0;
    for (;;) {
      Launch* job = nullptr;
      {
        std::unique_lock<std::mutex> lk(w.mu);
        w.cv.wait(lk, [&] { return w.stop || w.jobs != seen; });
        if (w.stop) return;
        seen = w.jobs;
      }
      {
        std::lock_guard<std::mutex> lk(done_mu_);
        job = job_;
      }
      run_thread(*job, index);
      std::lock_guard<std::mutex> lk(done_mu_);
      if (--remaining_ == 0) done_cv_.notify_one();
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  Launch* job_ = nullptr;
  unsigned remaining_ = 0;
};

std::atomic<int64_t> g_launches{0};
std::mutex g_launch_mu;
std::atomic<double> g_kernel_delay{0.0};  // seconds

}  // namespace

namespace detail {

SharedArray::SharedArray(void* address, size_t bytes) {
  std::memset(address, 0xFF, bytes);
  SharedArrays& a = shared_arrays();
  std::lock_guard<std::mutex> lk(a.mu);
  a.arrays.emplace_back(address, bytes);
}

// Runs a checked launch on the pool, one launch at a time (a slow device's delay after it);
// throws KernelFault if it faults.
void execute_launch(const LaunchArgs& args, const std::string& name, dim3 grid, dim3 block) {
  std::lock_guard<std::mutex> serial(g_launch_mu);
  Launch l;
  l.args = &args;
  l.name = name;
  l.grid = grid;
  l.block = block;
  l.threads = block.x * block.y * block.z;
  l.blocks = uint64_t{grid.x} * grid.y * grid.z;
  l.warps = std::vector<Warp>((l.threads + 31) / 32);
  for (unsigned i = 0; i < l.warps.size(); ++i) {
    const unsigned n = std::min(32u, l.threads - 32 * i);
    l.warps[i].lanes = n == 32 ? 0xffffffffu : (1u << n) - 1;
  }
  uint64_t index = 0;
  const ScheduleChoice choice = schedule_now(&index);
  static constexpr Schedule kRotation[] = {Schedule::kForward, Schedule::kReverse,
                                           Schedule::kRandom};
  l.order = choice.order == Schedule::kRotate ? kRotation[index % 3] : choice.order;
  if (l.serial()) {
    // Each launch its own sequence, the same on every run of the same program.
    l.rng.seed(choice.seed ^ (0x9E3779B97F4A7C15ull * (index + 1)));
    l.ready.assign((l.threads + 63) / 64, 0);
    l.go = std::make_unique<Signal[]>(l.threads);
    std::lock_guard<std::mutex> lk(l.mu);
    start_block_locked(l);
  }
  ++g_launches;
  poison_shared_arrays();
  Pool::instance().run(l);
  if (is_aborted(l)) throw KernelFault(l.fault);
  const std::string overrun = check_device_guards();
  if (!overrun.empty()) throw KernelFault("kernel " + name + ": " + overrun);
  const double delay = kernel_delay();
  if (delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
}

}  // namespace detail

int64_t launch_count() { return g_launches; }

int worker_threads() { return Pool::instance().size(); }

void set_kernel_delay(double seconds) {
  if (!(seconds >= 0 && seconds < 1e6))
    throw std::invalid_argument("set_kernel_delay: the delay must be in [0, 1e6) s");
  g_kernel_delay.store(seconds);
}

double kernel_delay() { return g_kernel_delay.load(); }

}  // namespace ddp_emu
