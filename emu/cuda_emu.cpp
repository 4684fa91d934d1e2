// The engine behind cuda_emu.h: the worker pool that runs the threads of one block at a time,
// the serial schedules that let one thread of the block run at a time, the block and warp
// barriers with their rule, deadlock and fault checks, the launch checks (dimensions, the
// kernels' compiled resource usage), and the host runtime (guarded and poisoned allocations,
// streams with their deferred queues, events, device queries).
#include "cuda_emu.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

thread_local uint3 threadIdx{0, 0, 0};
thread_local uint3 blockIdx{0, 0, 0};
thread_local dim3 blockDim{};
thread_local dim3 gridDim{};

namespace ddp_emu {
namespace detail {
// One operation queued on a stream in deferred mode: its sequence number on the stream and what
// it does. run never throws (every queued function catches what it can fail with).
struct QueuedOp {
  uint64_t seq;
  std::function<void()> run;
};
}  // namespace detail
}  // namespace ddp_emu

struct CUstream_st {
  CUstream_st(unsigned f, uint64_t s) : flags(f), serial(s) {}
  unsigned flags;
  uint64_t serial;  // tells this stream from a later one that got the same address
  // Deferred mode, all guarded by the registry mutex: the operations not started yet (next
  // first), the sequence numbers of the last one queued and of the last one finished, and
  // whether a thread is running the one after `completed` now.
  std::deque<ddp_emu::detail::QueuedOp> queue;
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  bool running = false;
};

struct CUevent_st {
  CUevent_st(unsigned f, uint64_t s) : flags(f), serial(s) {}
  unsigned flags;
  uint64_t serial;
  bool recorded = false;
  std::chrono::steady_clock::time_point when{};
  // The most recent record when it was queued (deferred mode): its stream and sequence number
  // there (stream null: it ran at call time). Records are numbered so that an older record
  // running late does not overwrite the time of the newer one.
  CUstream_st* stream = nullptr;
  uint64_t stream_serial = 0;
  uint64_t seq = 0;
  uint64_t generation = 0;
};

namespace ddp_emu {
namespace {

using detail::WarpOp;

constexpr unsigned kMaxBlockThreads = 1024;
constexpr unsigned kNoThread = ~0u;

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
  const detail::LaunchArgs* args = nullptr;
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

  // Serial schedules: the thread whose turn it is (kNoThread: none; read atomically by waiting
  // threads), the threads ready to run (a bit each), a wake-up word per thread.
  Schedule order = Schedule::kParallel;
  std::mt19937_64 rng;
  unsigned turn = kNoThread;
  std::vector<uint64_t> ready;
  std::unique_ptr<Signal[]> go;

  bool serial() const { return order != Schedule::kParallel; }

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
  if (l.serial()) {
    for (unsigned t = 0; t < l.threads; ++t) {
      l.go[t].bump();
      l.go[t].wake();
    }
  }
}

[[noreturn]] void fail_and_unwind(Launch& l, const std::string& cause) {
  fail_locked(l, cause);
  throw AbortBlock{};
}

// ----- serial schedules -------------------------------------------------------------------------

void mark_ready_locked(Launch& l, unsigned tid) { l.ready[tid / 64] |= uint64_t{1} << (tid % 64); }

// Takes the next ready thread in the launch's order out of the ready set; kNoThread if none.
unsigned take_next_locked(Launch& l) {
  const size_t words = l.ready.size();
  size_t w = words;
  unsigned bit = 0;
  if (l.order == Schedule::kForward) {
    for (w = 0; w < words && l.ready[w] == 0; ++w) {
    }
    if (w < words) bit = static_cast<unsigned>(__builtin_ctzll(l.ready[w]));
  } else if (l.order == Schedule::kReverse) {
    for (w = words; w > 0 && l.ready[w - 1] == 0; --w) {
    }
    if (w == 0) return kNoThread;
    --w;
    bit = 63u - static_cast<unsigned>(__builtin_clzll(l.ready[w]));
  } else {
    uint64_t count = 0;
    for (uint64_t word : l.ready) count += static_cast<uint64_t>(__builtin_popcountll(word));
    if (count == 0) return kNoThread;
    uint64_t k = l.rng() % count;
    for (w = 0; k >= static_cast<uint64_t>(__builtin_popcountll(l.ready[w])); ++w) {
      k -= static_cast<uint64_t>(__builtin_popcountll(l.ready[w]));
    }
    uint64_t word = l.ready[w];
    for (; k > 0; --k) word &= word - 1;  // drop the k lowest set bits
    bit = static_cast<unsigned>(__builtin_ctzll(word));
  }
  if (w >= words) return kNoThread;
  l.ready[w] &= ~(uint64_t{1} << bit);
  return static_cast<unsigned>(w * 64 + bit);
}

// The calling thread stops running (it waits, or it returned): the next ready thread goes.
void pass_turn_locked(Launch& l) {
  const unsigned next = take_next_locked(l);
  __atomic_store_n(&l.turn, next, __ATOMIC_RELEASE);
  if (next != kNoThread) {
    l.go[next].bump();
    l.go[next].wake();
  }
}

// Every thread of the block is ready and the first in the order goes (a block's start).
void start_block_locked(Launch& l) {
  if (!l.serial()) return;
  std::fill(l.ready.begin(), l.ready.end(), 0);
  for (unsigned t = 0; t < l.threads; ++t) mark_ready_locked(l, t);
  pass_turn_locked(l);
}

// Returns when it is thread `tid`'s turn (at once in the parallel schedule); throws AbortBlock
// when the launch fails meanwhile.
void wait_turn(Launch& l, unsigned tid) {
  if (!l.serial()) return;
  for (;;) {
    const uint32_t seen = l.go[tid].value();
    if (is_aborted(l)) throw AbortBlock{};
    if (__atomic_load_n(&l.turn, __ATOMIC_ACQUIRE) == tid) return;
    l.go[tid].wait_change(seen);
  }
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
    if (l.serial()) {
      for (unsigned i = 0; i < 32; ++i) {
        if (members >> i & 1u) mark_ready_locked(l, c.warp * 32 + i);
      }
      pass_turn_locked(l);
    }
    lk.unlock();
    for (unsigned i = 0; i < 32; ++i) {
      if (others >> i & 1u) w.released[i].wake();
    }
    wait_turn(l, c.tid);
    return;
  }
  ++l.blocked;
  check_deadlock_locked(l);
  Signal& mine = w.released[c.lane];
  const uint32_t seen = mine.value();
  if (l.serial()) pass_turn_locked(l);
  lk.unlock();
  mine.wait_change(seen);
  if (is_aborted(l)) throw AbortBlock{};
  wait_turn(l, c.tid);
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
  void* map = nullptr;  // device blocks: the whole mapping, guard pages included
  size_t map_bytes = 0;
};

// Device blocks: the checked all-ones bytes before the start (after the end: up to the next
// kAlignment), then an inaccessible page on either side of the mapping.
constexpr size_t kGuardBytes = 256;

size_t page_bytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t round_up(size_t v, size_t unit) { return (v + unit - 1) / unit * unit; }

// Maps [PROT_NONE page][... guard | bytes | all-ones to a multiple of 256][PROT_NONE page] and
// returns the 256-aligned start, every byte up to the end page all-ones; nullptr when out of
// memory.
void* map_device_block(size_t bytes, Allocation& a) {
  const size_t page = page_bytes();
  const size_t span = round_up(bytes, kAlignment);
  const size_t inner = round_up(span + kGuardBytes, page);
  const size_t total = inner + 2 * page;
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  char* b = static_cast<char*>(base);
  if (mprotect(b, page, PROT_NONE) != 0 || mprotect(b + page + inner, page, PROT_NONE) != 0) {
    munmap(base, total);
    return nullptr;
  }
  char* p = b + page + inner - span;
  std::memset(p - kGuardBytes, 0xFF, kGuardBytes + span);
  a.map = base;
  a.map_bytes = total;
  return p;
}

// Where the guard bytes around a device block were changed ("" if nowhere); restores them.
std::string check_guard(uintptr_t start, const Allocation& a) {
  unsigned char* p = reinterpret_cast<unsigned char*>(start);
  const size_t tail = round_up(a.bytes, kAlignment) - a.bytes;
  std::string where;
  for (size_t i = 0; i < kGuardBytes && where.empty(); ++i) {
    if (p[-static_cast<std::ptrdiff_t>(kGuardBytes - i)] != 0xFF)
      where = std::to_string(kGuardBytes - i) + " byte(s) before the start";
  }
  for (size_t i = 0; i < tail && where.empty(); ++i) {
    if (p[a.bytes + i] != 0xFF) where = "byte " + std::to_string(i) + " past the end";
  }
  if (where.empty()) return "";
  std::memset(p - kGuardBytes, 0xFF, kGuardBytes);
  std::memset(p + a.bytes, 0xFF, tail);
  char at[32];
  std::snprintf(at, sizeof at, "%p", static_cast<void*>(p));
  return "wrote outside a device allocation: " + where + " of the " + std::to_string(a.bytes) +
         "-byte block at " + at;
}

// Locking: `mu` guards everything here, every stream's queue and counters and every event's
// record state. It is never held while a queued operation runs (kernels need the worker pool,
// NCCL collectives wait for other processes), so running one stream's operation may run another
// stream's (a queued wait) without any lock held. A thread that finds the stream it must run
// already being run by another thread waits on `cv`, which is notified whenever an operation
// finishes or a stream goes away. Other locks taken while running operations (the launch mutex,
// the asynchronous-error mutex) are never held while taking `mu` or waiting on `cv`, except that
// a launch checks the guard bytes of the device blocks under `mu` before it lets the launch
// mutex go (nothing that holds `mu` waits for a launch).
struct Registry {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uintptr_t, Allocation> allocations;
  size_t device_bytes = 0;
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events;
  std::map<uintptr_t, size_t> registered;  // cudaHostRegister'ed ranges
  uint64_t next_serial = 1;
};

// Never destroyed: work still queued at exit is neither run nor freed, and whatever a stream or
// event points to stays reachable for the leak checker.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
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

// ----- stream mode and deferred queues ---------------------------------------------------------

std::atomic<int> g_mode{-1};  // a StreamMode, or -1 before the environment was read

StreamMode mode_now() {
  const int m = g_mode.load(std::memory_order_acquire);
  if (m >= 0) return static_cast<StreamMode>(m);
  static const int from_env = [] {
    try {
      return static_cast<int>(parse_stream_mode(std::getenv("DDP_EMU_STREAMS")));
    } catch (const std::exception& e) {
      // A misspelt mode must not silently test something else.
      std::fprintf(stderr, "cuda emulation: %s\n", e.what());
      std::abort();
    }
  }();
  int expected = -1;
  g_mode.compare_exchange_strong(expected, from_env);
  return static_cast<StreamMode>(g_mode.load());
}

bool deferred() { return mode_now() == StreamMode::kDeferred; }

// ----- thread schedule ---------------------------------------------------------------------------

struct ScheduleChoice {
  Schedule order;
  uint64_t seed;
};

std::mutex g_schedule_mu;
bool g_schedule_set = false;
ScheduleChoice g_schedule{Schedule::kParallel, 1};
uint64_t g_schedule_launches = 0;  // launches since the schedule was chosen

// The schedule of the next launch, and its place among the launches since it was chosen.

ScheduleChoice schedule_now(uint64_t* launch_index = nullptr) {
  std::lock_guard<std::mutex> lk(g_schedule_mu);
  if (!g_schedule_set) {
    g_schedule_set = true;
    try {
      g_schedule.order = parse_schedule(std::getenv("DDP_EMU_SCHEDULE"), &g_schedule.seed);
    } catch (const std::exception& e) {
      // A misspelt schedule must not silently test something else.
      std::fprintf(stderr, "cuda emulation: %s\n", e.what());
      std::abort();
    }
  }
  if (launch_index != nullptr) *launch_index = g_schedule_launches++;
  return g_schedule;
}

// The asynchronous error of the process, not yet returned, and the last deferred fault message.
std::mutex g_async_mu;
cudaError_t g_async_error = cudaSuccess;
std::string g_async_message;

void async_fault(cudaError_t e, const std::string& message) {
  {
    std::lock_guard<std::mutex> lk(g_async_mu);
    if (g_async_error == cudaSuccess) g_async_error = e;
    g_async_message = message;
  }
  // Nothing may be listening when it surfaces (a destructor ignoring the error): say it now.
  std::fprintf(stderr, "cuda emulation: a queued operation failed (%s): %s\n", cudaGetErrorName(e),
               message.c_str());
}

cudaError_t peek_async_error() {
  std::lock_guard<std::mutex> lk(g_async_mu);
  return g_async_error;
}

// Returns the pending asynchronous error once, as the caller's result and last error.
cudaError_t take_async_error() {
  cudaError_t e;
  {
    std::lock_guard<std::mutex> lk(g_async_mu);
    e = g_async_error;
    g_async_error = cudaSuccess;
  }
  return record(e);
}

bool alive_locked(const Registry& r, CUstream_st* s, uint64_t serial) {
  return r.streams.count(s) > 0 && s->serial == serial;
}

void enqueue_locked(CUstream_st* s, std::function<void()> run) {
  s->queue.push_back(detail::QueuedOp{++s->enqueued, std::move(run)});
}

// Runs stream s (if it still exists as `serial`) until its operation `target` has finished.
// Another thread running s meanwhile is waited for, then s's next operation is taken again.
void run_until(CUstream_st* s, uint64_t serial, uint64_t target) {
  Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  for (;;) {
    // Gone: cudaStreamDestroy ran its queue first.
    if (!alive_locked(r, s, serial) || s->completed >= target) return;
    if (s->running || s->queue.empty()) {
      r.cv.wait(lk);
      continue;
    }
    detail::QueuedOp op = std::move(s->queue.front());
    s->queue.pop_front();
    s->running = true;
    lk.unlock();
    op.run();
    op.run = nullptr;  // releases the operation's state (kernel arguments) outside the lock
    lk.lock();
    // cudaStreamDestroy waits while `running`, so s is still there.
    s->completed = op.seq;
    s->running = false;
    r.cv.notify_all();
  }
}

struct Pending {
  CUstream_st* stream;
  uint64_t serial;
  uint64_t target;
};

// Runs what is queued now on every stream (blocking ones only: what the legacy default stream
// waits for), oldest stream first, so that runs repeat exactly (not in address order).
void run_streams(bool blocking_only) {
  std::vector<Pending> todo;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    for (CUstream_st* s : r.streams) {
      if (blocking_only && (s->flags & cudaStreamNonBlocking) != 0) continue;
      if (s->enqueued > s->completed) todo.push_back(Pending{s, s->serial, s->enqueued});
    }
  }
  std::sort(todo.begin(), todo.end(),
            [](const Pending& a, const Pending& b) { return a.serial < b.serial; });
  for (const Pending& p : todo) run_until(p.stream, p.serial, p.target);
}

// What an operation on the legacy default stream, or a synchronous call, waits for first.
void before_legacy_op() {
  if (deferred()) run_streams(true);
}

// The most recent record of e if it may not have run yet (stream null when it has).
Pending pending_record_locked(const Registry& r, const CUevent_st* e) {
  if (e->stream != nullptr && alive_locked(r, e->stream, e->stream_serial) &&
      e->stream->completed < e->seq) {
    return Pending{e->stream, e->stream_serial, e->seq};
  }
  return Pending{nullptr, 0, 0};
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
  Allocation a{bytes, device};
  void* p = nullptr;
  // All-ones bytes read as NaN floats: memory a kernel reads before anything wrote it shows.
  if (device) {
    p = map_device_block(bytes, a);
    if (!p) return record(cudaErrorMemoryAllocation);
  } else {
    if (posix_memalign(&p, kAlignment, bytes) != 0 || !p) return record(cudaErrorMemoryAllocation);
    std::memset(p, 0xFF, bytes);
  }
  r.allocations[reinterpret_cast<uintptr_t>(p)] = a;
  if (device) r.device_bytes += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t release(void* ptr, bool device) {
  if (!ptr) return cudaSuccess;
  // CUDA's cudaFree and cudaFreeHost synchronise the device; queued work may use the memory.
  if (deferred()) run_streams(false);
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.allocations.end() || it->second.device != device) {
    return record(cudaErrorInvalidValue);
  }
  const Allocation a = it->second;
  r.allocations.erase(it);
  if (device) {
    r.device_bytes -= a.bytes;
    munmap(a.map, a.map_bytes);
  } else {
    std::free(ptr);
  }
  return cudaSuccess;
}

}  // namespace

// The first changed guard byte of any device block, as a message ("" if none).
std::string check_device_guards() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  std::string found;
  for (const auto& [start, a] : r.allocations) {
    if (!a.device) continue;
    std::string where = check_guard(start, a);
    if (found.empty()) found = std::move(where);
  }
  return found;
}

// ----- device-side entry points ----------------------------------------------------------------

namespace detail {

SharedArray::SharedArray(void* address, size_t bytes) {
  std::memset(address, 0xFF, bytes);
  SharedArrays& a = shared_arrays();
  std::lock_guard<std::mutex> lk(a.mu);
  a.arrays.emplace_back(address, bytes);
}

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
    if (l.serial()) {
      for (unsigned t = 0; t < l.threads; ++t) mark_ready_locked(l, t);
      pass_turn_locked(l);
    }
    lk.unlock();
    l.barrier.wake();
    wait_turn(l, c.tid);
    return;
  }
  ++l.blocked;
  check_deadlock_locked(l);
  const uint32_t seen = l.barrier.value();
  if (l.serial()) pass_turn_locked(l);
  lk.unlock();
  l.barrier.wait_change(seen);
  if (is_aborted(l)) throw AbortBlock{};
  wait_turn(l, c.tid);
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

namespace {

// Runs a checked launch on the pool, one launch at a time; throws KernelFault if it faults.
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
}

// The kernel's mangled name, or "" when the dynamic symbol table does not have it.
std::string kernel_symbol(void (*kernel_id)()) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(kernel_id), &info) && info.dli_sname) return info.dli_sname;
  return "";
}

std::string kernel_display_name(const std::string& symbol, void (*kernel_id)()) {
  if (!symbol.empty()) return demangle(symbol.c_str());
  char buf[32];
  std::snprintf(buf, sizeof buf, "at %p", reinterpret_cast<void*>(kernel_id));
  return buf;
}

// Throws KernelFault (recording the launch error) if a device would refuse the launch: its
// dimensions, and for a kernel with known usage the limits of every target architecture.
void check_launch(const std::string& symbol, const std::string& kernel_name, dim3 grid,
                  dim3 block) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  std::string bad;
  cudaError_t error = cudaErrorInvalidConfiguration;
  if (block.x == 0 || block.y == 0 || block.z == 0 || threads > kMaxBlockThreads) {
    bad = "a block has " + std::to_string(threads) + " threads (1 to 1024 allowed)";
  } else if (block.x > 1024 || block.y > 1024 || block.z > 64) {
    bad = "block dimensions exceed (1024,1024,64)";
  } else if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    bad = "the grid is empty";
  } else if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    bad = "grid dimensions exceed (2147483647,65535,65535)";
  } else if (!symbol.empty()) {
    const UsageTable& usage = kernel_usage();
    const auto it = usage.find(symbol);
    if (it != usage.end()) {
      for (const KernelUsage& u : it->second) {
        const ArchLimits* arch = find_arch(u.sm);
        if (arch == nullptr) continue;
        bad = launch_refusal(*arch, u, static_cast<unsigned>(threads));
        if (!bad.empty()) {
          if (block_registers(*arch, u, static_cast<unsigned>(threads)) > arch->regs_per_block)
            error = cudaErrorLaunchOutOfResources;
          break;
        }
      }
    }
  }
  if (bad.empty()) return;
  record(error);
  throw KernelFault("kernel " + kernel_name + ": " +
                    (error == cudaErrorLaunchOutOfResources ? "launch out of resources"
                                                            : "invalid launch configuration") +
                    ", grid " + triple(grid.x, grid.y, grid.z) + " block " +
                    triple(block.x, block.y, block.z) + ": " + bad);
}

// ----- kernel usage and launch audits ------------------------------------------------------------

struct UsageState {
  std::mutex mu;
  bool loaded = false;
  bool from_reports = false;
  UsageTable table;
};

UsageState& usage_state() {
  static UsageState* state = new UsageState;  // never destroyed: launches may outlive main
  return *state;
}

struct AuditState {
  std::mutex mu;
  bool active = false;
  std::vector<AuditedLaunch> launches;
};

AuditState& audit_state() {
  static AuditState* state = new AuditState;
  return *state;
}

// Records the launch and returns true when an AuditLaunches scope is open (it then never runs).
bool audit_launch(const std::string& symbol, const std::string& kernel_name, dim3 grid,
                  dim3 block) {
  AuditState& a = audit_state();
  std::lock_guard<std::mutex> lk(a.mu);
  if (!a.active) return false;
  a.launches.push_back(AuditedLaunch{symbol, kernel_name, grid, block});
  return true;
}

}  // namespace

void run_launch(void (*kernel_id)(), const char* name, dim3 grid, dim3 block, cudaStream_t stream,
                std::unique_ptr<const LaunchArgs> args) {
  if (g_ctx) {
    throw KernelFault(where(*g_ctx->launch) +
                      ": launched a kernel (dynamic parallelism is not emulated)");
  }
  const std::string symbol = kernel_symbol(kernel_id);
  const std::string kernel_name = name ? std::string(name) : kernel_display_name(symbol, kernel_id);
  check_launch(symbol, kernel_name, grid, block);
  if (audit_launch(symbol, kernel_name, grid, block)) return;
  {
    Registry& r = registry();
    std::unique_lock<std::mutex> lk(r.mu);
    if (!stream_valid_locked(r, stream)) {
      lk.unlock();
      record(cudaErrorInvalidResourceHandle);
      throw KernelFault("kernel " + kernel_name + ": launched on a stream that does not exist");
    }
    if (stream && deferred()) {
      std::shared_ptr<const LaunchArgs> kept(std::move(args));
      enqueue_locked(stream, [kept, kernel_name, grid, block] {
        try {
          execute_launch(*kept, kernel_name, grid, block);
        } catch (const std::exception& e) {
          async_fault(cudaErrorLaunchFailure, e.what());
        }
      });
      return;
    }
  }
  before_legacy_op();
  execute_launch(*args, kernel_name, grid, block);
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

StreamMode parse_stream_mode(const char* value) {
  if (value == nullptr || *value == '\0' || std::strcmp(value, "immediate") == 0) {
    return StreamMode::kImmediate;
  }
  if (std::strcmp(value, "deferred") == 0) return StreamMode::kDeferred;
  throw std::invalid_argument(std::string("DDP_EMU_STREAMS='") + value +
                              "' is not a stream mode (immediate or deferred)");
}

StreamMode stream_mode() { return mode_now(); }

Schedule parse_schedule(const char* value, uint64_t* seed) {
  *seed = 1;
  const std::string v = value ? value : "";
  if (v.empty() || v == "parallel") return Schedule::kParallel;
  if (v == "forward") return Schedule::kForward;
  if (v == "reverse") return Schedule::kReverse;
  if (v == "random") return Schedule::kRandom;
  if (v == "rotate") return Schedule::kRotate;
  if (v.rfind("random:", 0) == 0 && v.size() > 7 &&
      v.find_first_not_of("0123456789", 7) == std::string::npos && v.size() <= 7 + 19) {
    *seed = std::stoull(v.substr(7));
    return Schedule::kRandom;
  }
  throw std::invalid_argument("DDP_EMU_SCHEDULE='" + v +
                              "' is not a schedule (parallel, forward, reverse, random, "
                              "random:SEED or rotate)");
}

Schedule schedule() { return schedule_now().order; }

uint64_t schedule_seed() { return schedule_now().seed; }

void set_schedule(Schedule order, uint64_t seed) {
  std::lock_guard<std::mutex> lk(g_schedule_mu);
  g_schedule_set = true;
  g_schedule = ScheduleChoice{order, seed};
  g_schedule_launches = 0;
}

void set_stream_mode(StreamMode mode) {
  if (mode_now() == StreamMode::kDeferred && mode != StreamMode::kDeferred) run_streams(false);
  g_mode.store(static_cast<int>(mode), std::memory_order_release);
}

const UsageTable& kernel_usage() {
  detail::UsageState& u = detail::usage_state();
  std::lock_guard<std::mutex> lk(u.mu);
  if (!u.loaded) {
    u.loaded = true;
    const char* dir = std::getenv("DDP_EMU_KERNEL_RESOURCES");
    if (dir != nullptr && *dir != '\0') {
      u.table = load_usage_reports(dir);
      u.from_reports = !u.table.empty();
    }
  }
  return u.table;
}

bool have_kernel_usage() {
  kernel_usage();
  detail::UsageState& u = detail::usage_state();
  std::lock_guard<std::mutex> lk(u.mu);
  return u.from_reports;
}

void set_kernel_usage(UsageTable table) {
  detail::UsageState& u = detail::usage_state();
  std::lock_guard<std::mutex> lk(u.mu);
  u.table = std::move(table);
  u.loaded = true;
  u.from_reports = false;
}

AuditLaunches::AuditLaunches() {
  detail::AuditState& a = detail::audit_state();
  std::lock_guard<std::mutex> lk(a.mu);
  if (a.active) throw std::logic_error("AuditLaunches scopes do not nest");
  a.active = true;
  a.launches.clear();
}

AuditLaunches::~AuditLaunches() {
  detail::AuditState& a = detail::audit_state();
  std::lock_guard<std::mutex> lk(a.mu);
  a.active = false;
}

std::vector<AuditedLaunch> AuditLaunches::launches() const {
  detail::AuditState& a = detail::audit_state();
  std::lock_guard<std::mutex> lk(a.mu);
  return a.launches;
}

int64_t queued_operations(cudaStream_t stream) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!stream_valid_locked(r, stream)) return -1;
  return stream ? static_cast<int64_t>(stream->enqueued - stream->completed) : 0;
}

std::string last_deferred_fault() {
  std::lock_guard<std::mutex> lk(g_async_mu);
  return g_async_message;
}

bool stream_exists(cudaStream_t stream) { return stream_valid(stream); }

bool is_device_memory(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return false;
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  const auto* q = static_cast<const unsigned char*>(p);
  return in_device_allocation_locked(r, q, 1) && in_device_allocation_locked(r, q + bytes - 1, 1);
}

bool enqueue_host_work(cudaStream_t stream, std::function<void()> work) {
  if (!deferred()) return false;
  if (stream) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    if (r.streams.count(stream) > 0) {
      enqueue_locked(stream, [work = std::move(work)] {
        try {
          work();
        } catch (const std::exception& e) {
          async_fault(cudaErrorLaunchFailure, std::string("queued host work threw: ") + e.what());
        }
      });
      return true;
    }
  }
  before_legacy_op();
  return false;
}

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
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
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
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
  }
  return "unrecognized error code";
}

// A pending asynchronous error of the process comes after this thread's own last error.
cudaError_t cudaGetLastError() {
  const cudaError_t e = ddp_emu::g_last_error;
  ddp_emu::g_last_error = cudaSuccess;
  if (e != cudaSuccess) return e;
  const cudaError_t async = ddp_emu::take_async_error();
  ddp_emu::g_last_error = cudaSuccess;
  return async;
}

cudaError_t cudaPeekAtLastError() {
  return ddp_emu::g_last_error != cudaSuccess ? ddp_emu::g_last_error : ddp_emu::peek_async_error();
}

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

cudaError_t cudaDeviceSynchronize() {
  if (ddp_emu::deferred()) ddp_emu::run_streams(false);
  return ddp_emu::take_async_error();
}

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
  *stream = new CUstream_st(flags, r.next_serial++);
  r.streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

// Runs what is queued first, as CUDA lets a destroyed stream's work finish.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  ddp_emu::Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  for (;;) {
    if (!stream || r.streams.count(stream) == 0) return record(cudaErrorInvalidResourceHandle);
    if (stream->queue.empty() && !stream->running) break;
    const uint64_t serial = stream->serial, target = stream->enqueued;
    lk.unlock();
    ddp_emu::run_until(stream, serial, target);
    lk.lock();
  }
  r.streams.erase(stream);
  delete stream;
  r.cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  uint64_t serial = 0, target = 0;
  {
    ddp_emu::Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    if (!ddp_emu::stream_valid_locked(r, stream)) return record(cudaErrorInvalidResourceHandle);
    if (stream) {
      serial = stream->serial;
      target = stream->enqueued;
    }
  }
  if (stream) {
    ddp_emu::run_until(stream, serial, target);
  } else {
    ddp_emu::before_legacy_op();
  }
  return ddp_emu::take_async_error();
}

// Captures the event's most recent record now; the stream runs up to it when it gets there.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  ddp_emu::Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  if (!ddp_emu::stream_valid_locked(r, stream) || r.events.count(event) == 0) {
    return record(cudaErrorInvalidResourceHandle);
  }
  if (!ddp_emu::deferred()) return cudaSuccess;
  const ddp_emu::Pending p = ddp_emu::pending_record_locked(r, event);
  if (stream) {
    // Nothing to wait for (never recorded, or already run): a no-op, as in CUDA.
    if (p.stream != nullptr) {
      ddp_emu::enqueue_locked(stream, [p] { ddp_emu::run_until(p.stream, p.serial, p.target); });
    }
    return cudaSuccess;
  }
  lk.unlock();
  ddp_emu::before_legacy_op();
  if (p.stream != nullptr) ddp_emu::run_until(p.stream, p.serial, p.target);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) {
    return record(cudaErrorInvalidValue);
  }
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  *event = new CUevent_st(flags, r.next_serial++);
  r.events.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

// A record still queued finds the event gone and does nothing.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.events.erase(event) == 0) return record(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  ddp_emu::Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  if (r.events.count(event) == 0 || !ddp_emu::stream_valid_locked(r, stream)) {
    return record(cudaErrorInvalidResourceHandle);
  }
  const bool queued = stream && ddp_emu::deferred();
  if (!queued && stream == nullptr && ddp_emu::deferred()) {
    // On the legacy stream the record completes once the blocking streams' work ran.
    lk.unlock();
    ddp_emu::before_legacy_op();
    lk.lock();
    if (r.events.count(event) == 0) return record(cudaErrorInvalidResourceHandle);
  }
  event->recorded = true;
  const uint64_t generation = ++event->generation;
  if (!queued) {
    event->stream = nullptr;
    event->when = std::chrono::steady_clock::now();
    return cudaSuccess;
  }
  const uint64_t serial = event->serial;
  ddp_emu::enqueue_locked(stream, [event, serial, generation] {
    ddp_emu::Registry& reg = registry();
    std::lock_guard<std::mutex> held(reg.mu);
    // Destroyed, or recorded again since: that newer record sets the time.
    if (reg.events.count(event) == 0 || event->serial != serial ||
        event->generation != generation) {
      return;
    }
    event->when = std::chrono::steady_clock::now();
  });
  event->stream = stream;
  event->stream_serial = stream->serial;
  event->seq = stream->enqueued;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  ddp_emu::Pending p{nullptr, 0, 0};
  {
    ddp_emu::Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    if (r.events.count(event) == 0) return record(cudaErrorInvalidResourceHandle);
    p = ddp_emu::pending_record_locked(r, event);
  }
  if (p.stream != nullptr) ddp_emu::run_until(p.stream, p.serial, p.target);
  return ddp_emu::take_async_error();
}

// Not ready (as the thread's last error too, so callers clear it) while the most recent record
// has not run; that record is run right away, so the next query succeeds.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  ddp_emu::Pending p{nullptr, 0, 0};
  {
    ddp_emu::Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    if (r.events.count(event) == 0) return record(cudaErrorInvalidResourceHandle);
    p = ddp_emu::pending_record_locked(r, event);
  }
  if (p.stream == nullptr) return cudaSuccess;
  ddp_emu::run_until(p.stream, p.serial, p.target);
  return record(cudaErrorNotReady);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.events.count(start) == 0 || r.events.count(end) == 0 || !start->recorded ||
      !end->recorded || ((start->flags | end->flags) & cudaEventDisableTiming) != 0) {
    return record(cudaErrorInvalidResourceHandle);
  }
  if (ddp_emu::pending_record_locked(r, start).stream != nullptr ||
      ddp_emu::pending_record_locked(r, end).stream != nullptr) {
    return record(cudaErrorNotReady);
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

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  if (ptr == nullptr || size == 0 || flags != cudaHostRegisterDefault) {
    return record(cudaErrorInvalidValue);
  }
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!r.registered.emplace(reinterpret_cast<uintptr_t>(ptr), size).second) {
    return record(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  // Synchronises the device in CUDA: queued copies may still use the memory.
  if (ddp_emu::deferred()) ddp_emu::run_streams(false);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.registered.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
    return record(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

namespace {

struct CopySides {
  bool dst_device;
  bool src_device;
};

// Each side must be what the kind says: device memory lies wholly inside one cudaMalloc block,
// host memory touches none (a wrong direction or an overrun is a bug a real device hides).
bool copy_valid_locked(ddp_emu::Registry& r, void* dst, const void* src, size_t count,
                       cudaMemcpyKind kind, CopySides* sides) {
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
  if (sides) *sides = CopySides{dst_device, src_device};
  return side_ok(dst, dst_device) && side_ok(src, src_device);
}

// Page-locked host memory: cudaMallocHost / cudaHostAlloc blocks and cudaHostRegister ranges.
bool pinned_locked(const ddp_emu::Registry& r, const void* ptr, size_t n) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto a = ddp_emu::containing_locked(r, p);
  if (a != r.allocations.end() && !a->second.device && p + n <= a->first + a->second.bytes) {
    return true;
  }
  auto it = r.registered.upper_bound(p);
  if (it == r.registered.begin()) return false;
  --it;
  return p + n <= it->first + it->second;
}

bool copy_args_ok(const void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault && (count == 0 || (dst && src));
}

}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (!copy_args_ok(dst, src, count, kind)) return record(cudaErrorInvalidValue);
  if (count == 0) return cudaSuccess;
  ddp_emu::before_legacy_op();
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!copy_valid_locked(r, dst, src, count, kind, nullptr)) return record(cudaErrorInvalidValue);
  std::memmove(dst, src, count);
  return cudaSuccess;
}

// Deferred mode on a created stream: checked now, copied when the stream runs it (see the
// header for which host memory is read when).
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!ddp_emu::stream_valid(stream)) return record(cudaErrorInvalidResourceHandle);
  if (!stream || !ddp_emu::deferred()) return cudaMemcpy(dst, src, count, kind);
  if (!copy_args_ok(dst, src, count, kind)) return record(cudaErrorInvalidValue);
  if (count == 0) return cudaSuccess;
  ddp_emu::Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  if (r.streams.count(stream) == 0) return record(cudaErrorInvalidResourceHandle);
  CopySides sides{};
  if (!copy_valid_locked(r, dst, src, count, kind, &sides)) return record(cudaErrorInvalidValue);
  if (!sides.dst_device && !sides.src_device) {
    // Host to host is synchronous with the host, behind the stream's queued work.
    const uint64_t serial = stream->serial, target = stream->enqueued;
    lk.unlock();
    ddp_emu::run_until(stream, serial, target);
    std::memmove(dst, src, count);
    return cudaSuccess;
  }
  std::shared_ptr<std::vector<unsigned char>> staged;
  if (!sides.src_device && !pinned_locked(r, src, count)) {
    // Pageable source: the driver stages it before returning, so the caller may reuse it.
    const auto* p = static_cast<const unsigned char*>(src);
    staged = std::make_shared<std::vector<unsigned char>>(p, p + count);
  }
  // The memory checked now is still there when the copy runs: cudaFree, cudaFreeHost and
  // cudaHostUnregister run every queue first.
  ddp_emu::enqueue_locked(stream, [dst, src, count, staged] {
    std::memmove(dst, staged ? staged->data() : src, count);
  });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dev_ptr, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  ddp_emu::before_legacy_op();
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
  if (!stream || !ddp_emu::deferred()) return cudaMemset(dev_ptr, value, count);
  if (count == 0) return cudaSuccess;
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.streams.count(stream) == 0) return record(cudaErrorInvalidResourceHandle);
  if (!dev_ptr || !ddp_emu::in_device_allocation_locked(r, dev_ptr, count)) {
    return record(cudaErrorInvalidValue);
  }
  // Still device memory when it runs: cudaFree runs every queue first.
  ddp_emu::enqueue_locked(stream, [dev_ptr, value, count] { std::memset(dev_ptr, value, count); });
  return cudaSuccess;
}
