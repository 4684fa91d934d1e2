// Private to the files of the emulated CUDA runtime (kernels and tests include cuda_emu.h): the
// state they share (a launch and its block, the registry of allocations, streams and events)
// and the functions one of them calls in another, in ddp_emu::detail.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu.h"

namespace ddp_emu {
namespace detail {
// One operation queued on a stream in deferred mode: its sequence number on the stream, what it
// does and when it was queued (the device runs it itself once it waited longer than the device
// lag). run never throws (every queued function catches what it can fail with).
struct QueuedOp {
  uint64_t seq;
  std::function<void()> run;
  std::chrono::steady_clock::time_point queued;
};

// One operation of a captured graph: what it is (messages, graph_nodes), the earlier nodes it
// depends on, and what it does (never throws: a fault becomes an asynchronous error).
struct GraphNode {
  std::string what;
  std::vector<size_t> deps;
  std::function<void()> run;
};
using GraphNodes = std::vector<GraphNode>;

// A capture sequence (cuda_emu_graphs.cpp), guarded by the registry mutex: where and how it
// began, whether a prohibited call invalidated it, the nodes so far, and for every stream that
// takes part (the origin and the streams forked from it) the nodes its next operation depends
// on.
struct Capture {
  uint64_t id = 0;
  CUstream_st* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool invalidated = false;
  std::shared_ptr<GraphNodes> nodes = std::make_shared<GraphNodes>();
  std::map<CUstream_st*, std::vector<size_t>> tails;
};
}  // namespace detail
}  // namespace ddp_emu

struct CUstream_st {
  CUstream_st(unsigned f, uint64_t s) : flags(f), serial(s) {}
  unsigned flags;
  uint64_t serial;  // tells this stream from a later one that got the same address
  int priority = 0;
  // Deferred mode, all guarded by the registry mutex: the operations not started yet (next
  // first), the sequence numbers of the last one queued and of the last one finished, and
  // whether a thread is running the one after `completed` now.
  std::deque<ddp_emu::detail::QueuedOp> queue;
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  bool running = false;
  // The capture this stream takes part in (null: none), guarded by the registry mutex.
  std::shared_ptr<ddp_emu::detail::Capture> capture;
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
  // Recorded in a capturing stream: that capture and the nodes the record stands for (what a
  // stream waiting on it depends on). The eager record state above is left as it was.
  std::shared_ptr<ddp_emu::detail::Capture> capture;
  std::vector<size_t> captured_deps;
  // Last recorded in a capture that has ended: unusable until recorded again (CUDA answers
  // cudaErrorInvalidValue to a query, synchronisation, wait or elapsed time).
  bool orphaned = false;
};

// A graph from cudaStreamEndCapture and an instantiated one: the same immutable nodes, which a
// launch queued in deferred mode keeps alive after either is destroyed.
struct CUgraph_st {
  std::shared_ptr<const ddp_emu::detail::GraphNodes> nodes;
};
struct CUgraphExec_st {
  std::shared_ptr<const ddp_emu::detail::GraphNodes> nodes;
};

namespace ddp_emu {
namespace detail {

// ----- a launch and its block (cuda_emu_barriers.cpp, _schedule.cpp, _pool.cpp) -----------------

constexpr unsigned kNoThread = ~0u;

// Unwinds the threads of a block another thread already failed. Not a std::exception, so a
// kernel's own catch (const std::exception&) cannot swallow it.
struct AbortBlock {};

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

// The calling thread's place in the launch it runs; null outside a kernel.
extern thread_local ThreadCtx* g_ctx;

// Fault messages: a warp operation's name, file:line, a mask, a thread or block index, a type.
const char* op_name(WarpOp op);
std::string site(const char* file, int line);
std::string hex32(unsigned v);
std::string triple(unsigned x, unsigned y, unsigned z);
std::string demangle(const char* mangled);

bool is_aborted(const Launch& l);
// The running thread's kernel, block and thread, for a fault message.
std::string where(const Launch& l);
void fail_locked(Launch& l, const std::string& cause);
// What the threads of the block wait at, for a deadlock message.
std::string waits_locked(const Launch& l);

// The serial schedules (cuda_emu_schedule.cpp): the order of the next launch, the turns.
struct ScheduleChoice {
  Schedule order;
  uint64_t seed;
};
ScheduleChoice schedule_now(uint64_t* launch_index = nullptr);
void mark_ready_locked(Launch& l, unsigned tid);
void pass_turn_locked(Launch& l);
void start_block_locked(Launch& l);
void wait_turn(Launch& l, unsigned tid);

// The worker pool (cuda_emu_pool.cpp).
void execute_launch(const LaunchArgs& args, const std::string& name, dim3 grid, dim3 block);

// ----- errors (cuda_emu_errors.cpp) ------------------------------------------------------------

// Makes e the calling thread's last error unless it is cudaSuccess; returns e.
cudaError_t record(cudaError_t e);
// A queued operation failed: the process's asynchronous error, printed now.
void async_fault(cudaError_t e, const std::string& message);
cudaError_t take_async_error();

// ----- memory (cuda_emu_memory.cpp) and the registry (cuda_emu_streams.cpp) ---------------------

constexpr size_t kTotalGlobalMem = size_t{4} << 30;

struct Allocation {
  size_t bytes;
  bool device;
  void* map = nullptr;  // device blocks: the whole mapping, guard pages included
  size_t map_bytes = 0;
};

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
  std::vector<std::shared_ptr<Capture>> captures;  // begun, not yet ended
  std::set<CUgraph_st*> graphs;
  std::set<CUgraphExec_st*> execs;
};

Registry& registry();

// ----- streams (cuda_emu_streams.cpp) ----------------------------------------------------------

bool stream_valid_locked(Registry& r, cudaStream_t s);
bool stream_valid(cudaStream_t s);
// Whether the stream mode is deferred.
bool deferred();
void enqueue_locked(CUstream_st* s, std::function<void()> run);
void run_until(CUstream_st* s, uint64_t serial, uint64_t target);
void run_streams(bool blocking_only);
void before_legacy_op();
// Starts the thread that runs operations older than the device lag (cuda_emu_progress.cpp), once
// per process.
void start_device_thread();
// What a kernel launch queued or captured runs: the kernel, with a fault reported as an
// asynchronous error.
std::function<void()> launch_op(std::shared_ptr<const LaunchArgs> args, std::string name, dim3 grid,
                                dim3 block);

// ----- stream capture (cuda_emu_graphs.cpp); all with the registry mutex held
// ---------------------

// The rules of stream capture, from the CUDA Programming Guide, "CUDA Graphs" > "Prohibited and
// Unhandled Operations" (docs.nvidia.com/cuda/cuda-c-programming-guide/#prohibited-and-
// unhandled-operations), and the runtime reference for cudaThreadExchangeStreamCaptureMode.
// Each returns cudaSuccess or the error of the call, having invalidated the captures involved.

// Any use of the legacy stream while a blocking stream captures (it would depend on the capture
// implicitly): cudaErrorStreamCaptureImplicit, in every capture mode. The synchronous calls
// (cudaMemcpy, cudaMemset) are uses of the legacy stream.
cudaError_t legacy_stream_use_locked(Registry& r);
// A potentially unsafe call (allocating or freeing memory, which capture does not observe):
// cudaErrorStreamCaptureUnsupported if the thread's capture interaction mode forbids it now.
cudaError_t unsafe_call_locked(Registry& r);
// Synchronising the device while any stream captures: cudaErrorStreamCaptureUnsupported.
cudaError_t device_sync_locked(Registry& r);
// Records an operation on capturing stream s as a node after s's previous ones;
// cudaErrorStreamCaptureInvalidated (nothing recorded) if the capture was invalidated.
cudaError_t capture_locked(CUstream_st* s, std::string what, std::function<void()> run);
// Makes the capture fail at cudaStreamEndCapture.
void invalidate_locked(Capture& c);
// Synchronising or querying an event recorded in an ongoing capture (it stands for no work
// that will run): cudaErrorCapturedEvent, in every mode.
cudaError_t captured_event_use_locked(CUevent_st& event);
// cudaStreamWaitEvent when the stream or the event takes part in a capture.
cudaError_t wait_captured_locked(Registry& r, cudaStream_t stream, CUevent_st* event);

// ----- runtime-call counts (cuda_emu_calls.cpp) -------------------------------------------------

// One runtime function's call count: a static in that function (DDP_EMU_COUNT_CALL), listed
// for runtime_calls() when first reached.
class ApiCounter {
 public:
  explicit ApiCounter(const char* api);
  void add() { calls_.fetch_add(1, std::memory_order_relaxed); }
  const char* api() const { return api_; }
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  void reset() { calls_.store(0, std::memory_order_relaxed); }

 private:
  const char* api_;
  std::atomic<int64_t> calls_{0};
};
void count_kernel_launch();
void count_graph_launch();

// The name of an error code without counting a cudaGetErrorName call.
const char* error_name(cudaError_t e);

}  // namespace detail

// The first changed guard byte of any device block (cuda_emu_memory.cpp).
std::string check_device_guards();

// The runtime's files name these as ddp_emu::X or X, as when they were one file's anonymous
// namespace (which is a using-directive too).
using namespace detail;

}  // namespace ddp_emu

// Counts a call of the runtime function it opens (ddp_emu::runtime_calls).
#define DDP_EMU_COUNT_CALL()                                           \
  static ::ddp_emu::detail::ApiCounter ddp_emu_api_counter_(__func__); \
  ddp_emu_api_counter_.add()
