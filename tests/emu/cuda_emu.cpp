// The engine behind cuda_emu.h: the worker pool that runs the threads of one block at a time,
// the block and warp barriers with their rule, deadlock and fault checks, and the host runtime
// (checked allocations, streams, events, device queries).
#include "cuda_emu.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

thread_local uint3 threadIdx{0, 0, 0};
thread_local uint3 blockIdx{0, 0, 0};
thread_local dim3 blockDim{};
thread_local dim3 gridDim{};

struct CUstream_st {
  unsigned flags;
};

struct CUevent_st {
  unsigned flags;
  bool recorded;
  std::chrono::steady_clock::time_point when;
};

namespace ddp_emu {
namespace {

using detail::WarpOp;

constexpr unsigned kMaxBlockThreads = 1024;

// Unwinds the threads of a block another thread already failed. Not a std::exception, so a
// kernel's own catch (const std::exception&) cannot swallow it.
struct AbortBlock {};

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kSyncwarp:
      return "__syncwarp()";
    case WarpOp::kShfl:
      return "__shfl_sync()";
    case WarpOp::kShflUp:
      return "__shfl_up_sync()";
    case WarpOp::kShflDown:
      return "__shfl_down_sync()";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync()";
    case WarpOp::kBallot:
      return "__ballot_sync()";
    case WarpOp::kAny:
      return "__any_sync()";
    case WarpOp::kAll:
      return "__all_sync()";
  }
  return "warp operation";
}

std::string site(const char* file, int line) {
  return std::string(file ? file : "?") + ":" + std::to_string(line);
}

std::string hex32(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string triple(unsigned x, unsigned y, unsigned z) {
  return "(" + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")";
}

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(mangled);
}

// A word threads sleep on until it changes: a Linux futex, so waiting never spins, and a released
// thread goes on without taking the block mutex again (with a condition variable, hundreds of
// woken threads would queue for that mutex one by one at every barrier).
class Signal {
 public:
  uint32_t value() const { return __atomic_load_n(&word_, __ATOMIC_ACQUIRE); }
  // Called with the block mutex held; wake() after releasing it.
  void bump() { __atomic_fetch_add(&word_, 1u, __ATOMIC_RELEASE); }
  void wake() { syscall(SYS_futex, &word_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0); }
  void wait_change(uint32_t seen) {
    while (value() == seen) {
      syscall(SYS_futex, &word_, FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
    }
  }

 private:
  uint32_t word_ = 0;
};

// Lanes of one warp waiting together at one warp operation.
struct WarpGroup {
  unsigned mask;
  WarpOp op;
  const char* file;
  int line;
  unsigned arrived;  // lanes of the mask that are here
};

struct Warp {
  unsigned lanes = 0;   // lanes the block has in this warp (fewer in a partial last warp)
  unsigned exited = 0;  // lanes that returned from the kernel
  std::vector<WarpGroup> groups;
  uint64_t slots[32] = {};
  Signal released[32];  // per lane: bumped when the group the lane waits in completes
};

// One launch; the block state is reset between blocks. Everything below `mu` is guarded by it,
// except that `aborted` and the signals are also read atomically by waiting threads.
struct Launch {
  void (*body)(const void*) = nullptr;
  const void* ctx = nullptr;
  std::string name;
  dim3 grid, block;
  unsigned threads = 0;
  uint64_t blocks = 0;

  std::mutex mu;
  Signal barrier;        // bumped when a __syncthreads completes
  Signal block_end;      // bumped when the last thread of a block returns
  unsigned exited = 0;   // threads that returned from the kernel
  unsigned waiting = 0;  // threads at the current __syncthreads
  unsigned blocked = 0;  // threads waiting at any barrier (block or warp)
  const char* barrier_file = nullptr;
  int barrier_line = 0;
  bool aborted = false;
  std::string fault;
  std::vector<Warp> warps;

  void reset_block_locked() {
    exited = waiting = blocked = 0;
    barrier_file = nullptr;
    barrier_line = 0;
    for (Warp& w : warps) {
      w.exited = 0;
      w.groups.clear();
    }
  }
};

struct ThreadCtx {
  Launch* launch;
  unsigned tid;
  unsigned lane;
  unsigned warp;
};

thread_local ThreadCtx* g_ctx = nullptr;

ThreadCtx& current(const char* what, const char* file, int line) {
  if (!g_ctx) {
    throw KernelFault(std::string(what) + " at " + site(file, line) +
                      " called outside an emulated kernel");
  }
  return *g_ctx;
}

bool is_aborted(const Launch& l) { return __atomic_load_n(&l.aborted, __ATOMIC_ACQUIRE); }

std::string where(const Launch& l) {
  return "kernel " + l.name + ", block " + triple(blockIdx.x, blockIdx.y, blockIdx.z) +
         ", thread " + triple(threadIdx.x, threadIdx.y, threadIdx.z);
}

// Records the first fault of the launch and wakes every waiter of the block so it unwinds.
void fail_locked(Launch& l, const std::string& cause) {
  if (!is_aborted(l)) {
    l.fault = where(l) + ": " + cause;
    __atomic_store_n(&l.aborted, true, __ATOMIC_RELEASE);
  }
  l.barrier.bump();
  l.barrier.wake();
  l.block_end.bump();
  l.block_end.wake();
  for (Warp& w : l.warps) {
    for (Signal& s : w.released) {
      s.bump();
      s.wake();
    }
  }
}

[[noreturn]] void fail_and_unwind(Launch& l, const std::string& cause) {
  fail_locked(l, cause);
  throw AbortBlock{};
}

std::string waits_locked(const Launch& l) {
  std::ostringstream os;
  const char* sep = "";
  if (l.waiting > 0) {
    os << l.waiting << " thread(s) wait at __syncthreads() at "
       << site(l.barrier_file, l.barrier_line);
    sep = "; ";
  }
  for (size_t i = 0; i < l.warps.size(); ++i) {
    for (const WarpGroup& g : l.warps[i].groups) {
      os << sep << "lanes " << hex32(g.arrived) << " of warp " << i << " wait at " << op_name(g.op)
         << " at " << site(g.file, g.line) << " with mask " << hex32(g.mask);
      sep = "; ";
    }
  }
  if (l.exited > 0) os << sep << l.exited << " thread(s) returned from the kernel";
  return os.str();
}

// Called by a thread that is about to wait: if every thread still running waits too, none can
// ever be released (e.g. one lane at __syncthreads while its warp waits for it at a shuffle).
void check_deadlock_locked(Launch& l) {
  if (l.blocked > 0 && l.blocked + l.exited == l.threads) {
    fail_and_unwind(l, "deadlock, no thread of the block can go on: " + waits_locked(l));
  }
}

// Joins (or opens) the lanes' group at a warp operation and returns when the group is complete.
// Called with lk locked; returns with it unlocked.
void warp_arrive(Launch& l, const ThreadCtx& c, std::unique_lock<std::mutex>& lk, WarpOp op,
                 unsigned mask, const char* file, int line) {
  Warp& w = l.warps[c.warp];
  const unsigned me = 1u << c.lane;
  const std::string call = std::string(op_name(op)) + " at " + site(file, line);
  if (!(mask & me)) {
    fail_and_unwind(l, "called " + call + " with mask " + hex32(mask) +
                           " that does not include its own lane " + std::to_string(c.lane));
  }
  if (const unsigned gone = mask & w.exited) {
    fail_and_unwind(l, "called " + call + " with mask " + hex32(mask) + " but lanes " +
                           hex32(gone) + " of warp " + std::to_string(c.warp) +
                           " already returned from the kernel");
  }
  size_t gi = w.groups.size();
  for (size_t i = 0; i < w.groups.size(); ++i) {
    const WarpGroup& g = w.groups[i];
    if (g.mask == mask) {
      gi = i;
    } else if (g.mask & mask) {
      fail_and_unwind(l, "called " + call + " with mask " + hex32(mask) + " while lanes " +
                             hex32(g.arrived) + " of its warp wait at " + op_name(g.op) + " at " +
                             site(g.file, g.line) + " with mask " + hex32(g.mask) +
                             " (lanes of a warp must meet with the same mask)");
    }
  }
  if (gi == w.groups.size()) {
    w.groups.push_back(WarpGroup{mask, op, file, line, 0});
  } else if (w.groups[gi].op != op) {
    const WarpGroup& g = w.groups[gi];
    fail_and_unwind(l, "called " + call + " while lanes " + hex32(g.arrived) +
                           " of its warp wait at " + op_name(g.op) + " at " + site(g.file, g.line) +
                           " (lanes of a warp must meet at the same warp operation)");
  }
  WarpGroup& g = w.groups[gi];
  g.arrived |= me;
  const unsigned members = mask & w.lanes;
  if (g.arrived == members) {
    const unsigned others = members & ~me;
    for (unsigned i = 0; i < 32; ++i) {
      if (others >> i & 1u) w.released[i].bump();
    }
    l.blocked -= static_cast<unsigned>(__builtin_popcount(others));
    w.groups.erase(w.groups.begin() + static_cast<std::ptrdiff_t>(gi));
    lk.unlock();
    for (unsigned i = 0; i < 32; ++i) {
      if (others >> i & 1u) w.released[i].wake();
    }
    return;
  }
  ++l.blocked;
  check_deadlock_locked(l);
  Signal& mine = w.released[c.lane];
  const uint32_t seen = mine.value();
  lk.unlock();
  mine.wait_change(seen);
  if (is_aborted(l)) throw AbortBlock{};
}

// Source lane of a shuffle by PTX's rules; the own lane when the source is out of the segment.
unsigned shuffle_source(WarpOp op, unsigned lane, int lane_arg, int width) {
  const int64_t base = lane & ~static_cast<unsigned>(width - 1);
  const int64_t last = base + width - 1;
  const int64_t me = lane;
  const int64_t delta = static_cast<uint32_t>(lane_arg);
  int64_t j = me;
  switch (op) {
    case WarpOp::kShfl:
      j = base | (lane_arg & (width - 1));
      break;
    case WarpOp::kShflUp:
      j = me - delta >= base ? me - delta : me;
      break;
    case WarpOp::kShflDown:
      j = me + delta <= last ? me + delta : me;
      break;
    case WarpOp::kShflXor:
      j = (me ^ delta) <= last ? (me ^ delta) : me;
      break;
    default:
      break;
  }
  return static_cast<unsigned>(j);
}

// ----- the worker pool ------------------------------------------------------------------------

// Runs the kernel for the calling thread; false when the launch is failing.
bool run_body(Launch& l) {
  try {
    l.body(l.ctx);
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
    if (!run_body(l) || !finish_block(l, c)) break;
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

// ----- runtime state --------------------------------------------------------------------------

constexpr size_t kTotalGlobalMem = size_t{4} << 30;
constexpr size_t kAlignment = 256;

thread_local cudaError_t g_last_error = cudaSuccess;

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) g_last_error = e;
  return e;
}

struct Allocation {
  size_t bytes;
  bool device;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Allocation> allocations;
  size_t device_bytes = 0;
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::atomic<int> g_sm_count{4};
std::atomic<int64_t> g_launches{0};
std::mutex g_launch_mu;

bool stream_valid_locked(Registry& r, cudaStream_t s) { return !s || r.streams.count(s) > 0; }

bool stream_valid(cudaStream_t s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return stream_valid_locked(r, s);
}

// The allocation holding address p, or end().
std::map<uintptr_t, Allocation>::const_iterator containing_locked(const Registry& r, uintptr_t p) {
  auto it = r.allocations.upper_bound(p);
  if (it == r.allocations.begin()) return r.allocations.end();
  --it;
  return p < it->first + std::max<size_t>(it->second.bytes, 1) ? it : r.allocations.end();
}

bool in_device_allocation_locked(const Registry& r, const void* ptr, size_t n) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = containing_locked(r, p);
  return it != r.allocations.end() && it->second.device && p + n <= it->first + it->second.bytes;
}

bool overlaps_device_locked(const Registry& r, const void* ptr, size_t n) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = containing_locked(r, p);
  if (it != r.allocations.end() && it->second.device) return true;
  for (it = r.allocations.upper_bound(p); it != r.allocations.end() && it->first < p + n; ++it) {
    if (it->second.device) return true;
  }
  return false;
}

cudaError_t allocate(void** ptr, size_t bytes, bool device) {
  if (!ptr) return record(cudaErrorInvalidValue);
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (device && bytes > kTotalGlobalMem - r.device_bytes) return record(cudaErrorMemoryAllocation);
  void* p = nullptr;
  if (posix_memalign(&p, kAlignment, bytes) != 0 || !p) return record(cudaErrorMemoryAllocation);
  // All-ones bytes read as NaN floats: memory a kernel reads before anything wrote it shows.
  std::memset(p, 0xFF, bytes);
  r.allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, device};
  if (device) r.device_bytes += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t release(void* ptr, bool device) {
  if (!ptr) return cudaSuccess;
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.allocations.end() || it->second.device != device) {
    return record(cudaErrorInvalidValue);
  }
  if (device) r.device_bytes -= it->second.bytes;
  r.allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

}  // namespace

// ----- device-side entry points ----------------------------------------------------------------

namespace detail {

void sync_threads(const char* file, int line) {
  ThreadCtx& c = current("__syncthreads()", file, line);
  Launch& l = *c.launch;
  std::unique_lock<std::mutex> lk(l.mu);
  if (is_aborted(l)) throw AbortBlock{};
  const std::string here = "__syncthreads() at " + site(file, line);
  if (l.exited > 0) {
    fail_and_unwind(l, "reached " + here + " while " + std::to_string(l.exited) +
                           " thread(s) of the block already returned from the kernel (every "
                           "thread must reach every __syncthreads())");
  }
  if (l.waiting == 0) {
    l.barrier_file = file;
    l.barrier_line = line;
  } else if (line != l.barrier_line || std::strcmp(file, l.barrier_file) != 0) {
    fail_and_unwind(l, "reached " + here + " while " + std::to_string(l.waiting) +
                           " thread(s) wait at __syncthreads() at " +
                           site(l.barrier_file, l.barrier_line) +
                           " (all threads must meet at the same __syncthreads())");
  }
  if (++l.waiting == l.threads) {
    l.waiting = 0;
    l.blocked -= l.threads - 1;
    l.barrier.bump();
    lk.unlock();
    l.barrier.wake();
    return;
  }
  ++l.blocked;
  check_deadlock_locked(l);
  const uint32_t seen = l.barrier.value();
  lk.unlock();
  l.barrier.wait_change(seen);
  if (is_aborted(l)) throw AbortBlock{};
}

void sync_warp(unsigned mask, const char* file, int line) {
  ThreadCtx& c = current("__syncwarp()", file, line);
  Launch& l = *c.launch;
  std::unique_lock<std::mutex> lk(l.mu);
  if (is_aborted(l)) throw AbortBlock{};
  warp_arrive(l, c, lk, WarpOp::kSyncwarp, mask, file, line);
}

// Exchange through per-lane slots: write, meet, read the partner, meet again so no lane
// overwrites its slot (in its next exchange) before every lane has read it.
uint64_t shuffle(WarpOp op, unsigned mask, uint64_t bits, int lane_arg, int width, const char* file,
                 int line) {
  ThreadCtx& c = current(op_name(op), file, line);
  Launch& l = *c.launch;
  std::unique_lock<std::mutex> lk(l.mu);
  if (is_aborted(l)) throw AbortBlock{};
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    fail_and_unwind(l, std::string("called ") + op_name(op) + " at " + site(file, line) +
                           " with width " + std::to_string(width) +
                           " (must be a power of 2 from 1 to 32)");
  }
  Warp& w = l.warps[c.warp];
  w.slots[c.lane] = bits;
  warp_arrive(l, c, lk, op, mask, file, line);
  // Slots stay put until every member arrives below, so they are read without the mutex.
  const unsigned src = shuffle_source(op, c.lane, lane_arg, width);
  const bool present = (mask & w.lanes) >> src & 1u;
  const uint64_t out = present ? w.slots[src] : ~uint64_t{0};
  lk.lock();
  if (is_aborted(l)) throw AbortBlock{};
  warp_arrive(l, c, lk, op, mask, file, line);
  return out;
}

unsigned vote(WarpOp op, unsigned mask, bool predicate, const char* file, int line) {
  ThreadCtx& c = current(op_name(op), file, line);
  Launch& l = *c.launch;
  std::unique_lock<std::mutex> lk(l.mu);
  if (is_aborted(l)) throw AbortBlock{};
  Warp& w = l.warps[c.warp];
  w.slots[c.lane] = predicate ? 1 : 0;
  warp_arrive(l, c, lk, op, mask, file, line);
  const unsigned members = mask & w.lanes;
  unsigned ballot = 0;
  for (unsigned i = 0; i < 32; ++i) {
    if ((members >> i & 1u) && w.slots[i] != 0) ballot |= 1u << i;
  }
  lk.lock();
  if (is_aborted(l)) throw AbortBlock{};
  warp_arrive(l, c, lk, op, mask, file, line);
  if (op == WarpOp::kAny) return ballot != 0;
  if (op == WarpOp::kAll) return ballot == members;
  return ballot;
}

void run_launch(void (*kernel_id)(), const char* name, dim3 grid, dim3 block, cudaStream_t stream,
                void (*body)(const void*), const void* ctx) {
  if (g_ctx) {
    throw KernelFault(where(*g_ctx->launch) +
                      ": launched a kernel (dynamic parallelism is not emulated)");
  }
  std::string kernel_name;
  if (name) {
    kernel_name = name;
  } else {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(kernel_id), &info) && info.dli_sname) {
      kernel_name = demangle(info.dli_sname);
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "at %p", reinterpret_cast<void*>(kernel_id));
      kernel_name = buf;
    }
  }
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  std::string bad;
  if (block.x == 0 || block.y == 0 || block.z == 0 || threads > kMaxBlockThreads) {
    bad = "a block has " + std::to_string(threads) + " threads (1 to 1024 allowed)";
  } else if (block.x > 1024 || block.y > 1024 || block.z > 64) {
    bad = "block dimensions exceed (1024,1024,64)";
  } else if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    bad = "the grid is empty";
  } else if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    bad = "grid dimensions exceed (2147483647,65535,65535)";
  }
  if (!bad.empty()) {
    record(cudaErrorInvalidConfiguration);
    throw KernelFault("kernel " + kernel_name + ": invalid launch configuration, grid " +
                      triple(grid.x, grid.y, grid.z) + " block " +
                      triple(block.x, block.y, block.z) + ": " + bad);
  }
  if (!stream_valid(stream)) {
    record(cudaErrorInvalidResourceHandle);
    throw KernelFault("kernel " + kernel_name + ": launched on a stream that does not exist");
  }

  std::lock_guard<std::mutex> serial(g_launch_mu);
  Launch l;
  l.body = body;
  l.ctx = ctx;
  l.name = kernel_name;
  l.grid = grid;
  l.block = block;
  l.threads = static_cast<unsigned>(threads);
  l.blocks = uint64_t{grid.x} * grid.y * grid.z;
  l.warps = std::vector<Warp>((l.threads + 31) / 32);
  for (unsigned i = 0; i < l.warps.size(); ++i) {
    const unsigned n = std::min(32u, l.threads - 32 * i);
    l.warps[i].lanes = n == 32 ? 0xffffffffu : (1u << n) - 1;
  }
  ++g_launches;
  Pool::instance().run(l);
  if (is_aborted(l)) throw KernelFault(l.fault);
}

}  // namespace detail

void set_sm_count(int n) {
  if (n < 1) throw std::invalid_argument("ddp_emu::set_sm_count: n must be >= 1");
  g_sm_count = n;
}

int sm_count() { return g_sm_count; }

int64_t live_allocations() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return static_cast<int64_t>(r.allocations.size());
}

int64_t launch_count() { return g_launches; }

int worker_threads() { return Pool::instance().size(); }

}  // namespace ddp_emu

// ----- host runtime ---------------------------------------------------------------------------

using ddp_emu::record;
using ddp_emu::registry;

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
  }
  return "unrecognized error code";
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = ddp_emu::g_last_error;
  ddp_emu::g_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return ddp_emu::g_last_error; }

namespace {
// DDP_EMU_DEVICES=N makes the emulation report N devices (default 1), so the code that gives
// each local rank its own GPU can run; they all share the host's memory.
int emulated_devices() {
  const char* v = std::getenv("DDP_EMU_DEVICES");
  const int n = v != nullptr ? std::atoi(v) : 1;
  return n >= 1 ? n : 1;
}
bool valid_device(int device) { return device >= 0 && device < emulated_devices(); }
thread_local int current_device = 0;
}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return record(cudaErrorInvalidValue);
  *count = emulated_devices();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device)) return record(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return record(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return record(cudaErrorInvalidValue);
  if (!valid_device(device)) return record(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "%s", "DDP CUDA emulator (CPU)");
  prop->totalGlobalMem = ddp_emu::kTotalGlobalMem;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = warpSize;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 64 * 1024;
  prop->major = 8;
  prop->minor = 0;
  prop->multiProcessorCount = ddp_emu::sm_count();
  prop->memoryBusWidth = 256;
  prop->l2CacheSize = 4 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->sharedMemPerMultiprocessor = 164 * 1024;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return record(cudaErrorInvalidValue);
  if (!valid_device(device)) return record(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = warpSize;
      return cudaSuccess;
    case cudaDevAttrClockRate:
      *value = 1500000;  // kHz
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = ddp_emu::sm_count();
      return cudaSuccess;
    case cudaDevAttrMemoryClockRate:
      *value = 1000000;  // kHz
      return cudaSuccess;
    case cudaDevAttrGlobalMemoryBusWidth:
      *value = 256;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 8;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
  }
  return record(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (!free_bytes || !total_bytes) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  *total_bytes = ddp_emu::kTotalGlobalMem;
  *free_bytes = ddp_emu::kTotalGlobalMem - r.device_bytes;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (!stream || (flags & ~cudaStreamNonBlocking) != 0) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  *stream = new CUstream_st{flags};
  r.streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!stream || r.streams.erase(stream) == 0) return record(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return ddp_emu::stream_valid(stream) ? cudaSuccess : record(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!ddp_emu::stream_valid_locked(r, stream) || r.events.count(event) == 0) {
    return record(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) {
    return record(cudaErrorInvalidValue);
  }
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  *event = new CUevent_st{flags, false, {}};
  r.events.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.events.erase(event) == 0) return record(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.events.count(event) == 0 || !ddp_emu::stream_valid_locked(r, stream)) {
    return record(cudaErrorInvalidResourceHandle);
  }
  event->recorded = true;
  event->when = std::chrono::steady_clock::now();
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return r.events.count(event) ? cudaSuccess : record(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.events.count(start) == 0 || r.events.count(end) == 0 || !start->recorded ||
      !end->recorded || ((start->flags | end->flags) & cudaEventDisableTiming) != 0) {
    return record(cudaErrorInvalidResourceHandle);
  }
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** dev_ptr, size_t size) {
  return ddp_emu::allocate(dev_ptr, size, true);
}

cudaError_t cudaFree(void* dev_ptr) { return ddp_emu::release(dev_ptr, true); }

cudaError_t cudaMallocHost(void** ptr, size_t size) { return ddp_emu::allocate(ptr, size, false); }

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  if ((flags & ~(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined)) != 0) {
    return record(cudaErrorInvalidValue);
  }
  return ddp_emu::allocate(ptr, size, false);
}

cudaError_t cudaFreeHost(void* ptr) { return ddp_emu::release(ptr, false); }

namespace {
std::mutex registered_mutex;
std::set<void*> registered;
}  // namespace

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  if (ptr == nullptr || size == 0 || flags != cudaHostRegisterDefault) {
    return record(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> lk(registered_mutex);
  if (!registered.insert(ptr).second) return record(cudaErrorInvalidValue);
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  std::lock_guard<std::mutex> lk(registered_mutex);
  if (registered.erase(ptr) == 0) return record(cudaErrorInvalidValue);
  return cudaSuccess;
}

// Each side must be what the kind says: device memory lies wholly inside one cudaMalloc block,
// host memory touches none (a wrong direction or an overrun is a bug a real device hides).
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return record(cudaErrorInvalidValue);
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto side_ok = [&](const void* p, bool device_side) {
    return device_side ? ddp_emu::in_device_allocation_locked(r, p, count)
                       : !ddp_emu::overlaps_device_locked(r, p, count);
  };
  bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault) {
    dst_device = ddp_emu::overlaps_device_locked(r, dst, 1);
    src_device = ddp_emu::overlaps_device_locked(r, src, 1);
  }
  if (!side_ok(dst, dst_device) || !side_ok(src, src_device)) {
    return record(cudaErrorInvalidValue);
  }
  std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!ddp_emu::stream_valid(stream)) return record(cudaErrorInvalidResourceHandle);
  return cudaMemcpy(dst, src, count, kind);
}

cudaError_t cudaMemset(void* dev_ptr, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!dev_ptr || !ddp_emu::in_device_allocation_locked(r, dev_ptr, count)) {
    return record(cudaErrorInvalidValue);
  }
  std::memset(dev_ptr, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream) {
  if (!ddp_emu::stream_valid(stream)) return record(cudaErrorInvalidResourceHandle);
  return cudaMemset(dev_ptr, value, count);
}
