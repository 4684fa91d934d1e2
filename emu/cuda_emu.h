// A CPU emulation of the CUDA execution model and of a subset of the CUDA runtime, for tests only:
// with DDP_CUDA_EMULATION defined, kernel sources include this header instead of <cuda_runtime.h>,
// compile as plain C++17 and run on the host, so CI catches indexing, tiling and barrier mistakes.
//
// How it executes (and what that means for kernel code):
// - ddp_emu::launch runs the blocks of a grid ONE AFTER ANOTHER; the threads of a block are real
//   threads (a pool of up to 1024 workers), so barriers, shuffles and races behave like on a
//   device, or take turns one at a time in an adversarial order (serial schedules, below).
// - `__shared__` is `static`: a function-local static array is shared by the threads of the running
//   block exactly like shared memory because only one block runs at a time. Consequences: declare
//   shared arrays at function scope (kernel or inline __device__ helper), never `extern __shared__`
//   (dynamic shared memory is not supported). Name each one in DDP_EMU_SHARED(name) after its
//   declaration: it is then filled with all-ones bytes before every block, so a read of a location
//   the block has not written is NaN or -1 (an unregistered array keeps the previous block's data).
// - Device allocations (cudaMalloc) end where an inaccessible page begins: a read or write past
//   the end of one stops the process (SIGSEGV; AddressSanitizer prints where). The bytes up to
//   the next 256 and the 256 before the start hold all-ones bytes; a launch that changed them
//   fails with KernelFault naming the allocation.
// - A launch a device would refuse fails (KernelFault, cudaErrorInvalidConfiguration or
//   cudaErrorLaunchOutOfResources): its dimensions always, and for a kernel ptxas reported on
//   (DDP_EMU_KERNEL_RESOURCES, launch_limits.h) its registers and shared memory on every target
//   architecture.
// - `__device__` and `__forceinline__` expand to nothing (not `inline`, which would break
//   `__device__ inline` and `inline __forceinline__`): functions defined in headers must say
//   `inline` themselves.
// - Streams run in one of two modes (ddp_emu::StreamMode): IMMEDIATE (the default) runs every
//   operation at call time, so streams are trivially ordered, events complete when recorded and
//   cudaMemcpyAsync is a cudaMemcpy. DEFERRED (DDP_EMU_STREAMS=deferred) behaves like a device
//   that runs nothing until the host depends on it, which is what exposes a missing
//   cudaStreamWaitEvent or a host read without a synchronisation:
//   * Kernel launches, cudaMemcpyAsync, cudaMemsetAsync, cudaEventRecord and cudaStreamWaitEvent
//     on a created stream are checked at call time (launch and argument errors surface there, as
//     in immediate mode) and queued on that stream, in order.
//   * The legacy default stream (0) and the synchronous calls (cudaMemcpy, cudaMemset, anything
//     on stream 0) first run everything queued on the BLOCKING streams (cudaStreamCreate, flags
//     0), then run at once. Streams made with cudaStreamNonBlocking are left alone, as CUDA's
//     legacy stream does not synchronise with them.
//   * Only what a host synchronisation depends on runs: cudaStreamSynchronize runs its stream,
//     cudaEventSynchronize the event's stream up to its most recent record, cudaStreamWaitEvent
//     makes the waiting stream run the event's stream up to that record when it gets there, and
//     cudaDeviceSynchronize (also cudaFree, cudaFreeHost and cudaHostUnregister, which
//     synchronise the device in CUDA) runs everything. Other queues stay queued, so a consumer
//     that forgot to wait reads what the memory held before (cudaMalloc memory is NaN).
//   * Until the device lag has passed (DDP_EMU_DEVICE_LAG_S, default 2 s, "never" for never;
//     set_device_lag): an operation queued longer than that is run by the device's own thread,
//     with what its stream queued before it, as a device runs its queues whether or not the host
//     waits. So no process waits for ever on work its peer's host never synchronises on (a
//     NCCL collective queued by a rank that went on into an MPI call), and a host that polls
//     an event while the device runs that stream sees cudaErrorNotReady, as on a device.
//   * cudaEventQuery on an event whose record has not run runs it and returns cudaErrorNotReady
//     that once (a polling loop sees "not ready" and still finishes; like older CUDA versions it
//     is also the thread's last error, which callers clear; while another thread runs that
//     stream, it returns cudaErrorNotReady at once); cudaEventElapsedTime on it returns
//     cudaErrorNotReady. Event times are the host time the record RAN at.
//   * cudaMemcpyAsync from pageable host memory to the device reads the source at call time (the
//     driver stages it), from pinned memory (cudaMallocHost, cudaHostRegister) when it runs; a
//     copy into host memory writes it when it runs; host to host copies run at once, after the
//     stream's queued work.
//   * A fault in a queued operation (a kernel breaking a rule below, a copy gone invalid) is an
//     asynchronous error: it is printed with the fault message (kept by last_deferred_fault())
//     and returned once by the next cudaStreamSynchronize, cudaEventSynchronize,
//     cudaDeviceSynchronize or cudaGetLastError of the process (cudaErrorLaunchFailure for
//     kernels).
//   * cudaStreamDestroy runs the stream's queue first. Work still queued at process exit never
//     runs (the device thread may have run what was older than the lag).
//   Threads may queue and synchronise concurrently; a stream's operations run in order, on one
//   thread at a time (whichever synchronises), never while the runtime's lock is held.
// - Stream capture and graphs (cuda_emu_graphs.cpp) follow the CUDA Programming Guide ("CUDA
//   Graphs" > "Prohibited and Unhandled Operations") and the runtime reference; where both are
//   silent, the emulation answers what CUDA 13 answered on an H200:
//   * Between cudaStreamBeginCapture and cudaStreamEndCapture, kernel launches,
//     cudaMemcpyAsync, cudaMemsetAsync, NCCL collectives (enqueue_host_work) and graph launches
//     on the stream are checked as usual and recorded as graph nodes, not run; kernel
//     arguments are taken by value then, copies and memsets read and write through the
//     captured pointers when the graph runs. cudaEventRecord in a capturing stream records no
//     node: the event stands for the stream's last nodes. A stream that waits on such an event
//     joins the capture (a fork), and every forked stream must be waited on by the origin again
//     before cudaStreamEndCapture (else cudaErrorStreamCaptureUnjoined and no graph). Work queued
//     before the capture began is not part of it.
//   * Prohibited calls return their error and invalidate the capture (the origin's
//     cudaStreamEndCapture then returns cudaErrorStreamCaptureInvalidated and a null graph;
//     until then every operation on its streams returns it, a launch throws KernelFault):
//     synchronising a capturing stream or the device (cudaErrorStreamCaptureUnsupported);
//     querying or synchronising an event recorded in the capture (cudaErrorCapturedEvent);
//     any use of the legacy stream, synchronous cudaMemcpy and cudaMemset included, while a
//     blocking stream captures (cudaErrorStreamCaptureImplicit; not while only non-blocking
//     streams capture); waiting on an event recorded outside the capture
//     (cudaErrorStreamCaptureIsolation; a never-recorded event is a no-op) or in another
//     capture (cudaErrorStreamCaptureMerge); allocating or freeing memory (cudaMalloc, cudaFree,
//     cudaMallocHost, cudaHostAlloc, cudaFreeHost, cudaHostRegister, cudaHostUnregister:
//     cudaErrorStreamCaptureUnsupported) when the thread's capture interaction mode forbids it
//     (cudaThreadExchangeStreamCaptureMode: Global during this thread's non-Relaxed captures
//     and other threads' Global ones, ThreadLocal during this thread's own, Relaxed never).
//     cudaStreamDestroy of a capturing stream is refused the same way (the emulation's choice).
//   * An event last recorded in a capture that has ended answers cudaErrorInvalidValue to a
//     query, synchronisation, wait or elapsed time until it is recorded again; a graph launch
//     records no event.
//   * cudaGraphLaunch replays the nodes in capture order (a topological order) on its stream:
//     at once in immediate mode, queued node by node in deferred mode (they run when something
//     waits for the stream); a kernel that faults there is an asynchronous error, as on a
//     device. The nodes are shared, so destroying the graph or the executable graph after a
//     launch leaves what was launched intact.
// - runtime_calls() counts every runtime function call served and every call of the emulated
//   NCCL (by name), the kernel launches and the graph launches: how many host calls a training
//   step makes, eager or as a graph.
// - Threads of a block take turns by a schedule (ddp_emu::Schedule, DDP_EMU_SCHEDULE): PARALLEL
//   (the default) lets them all run at once, as the operating system schedules them. FORWARD,
//   REVERSE and RANDOM[:SEED] run ONE thread at a time: it runs alone until it stops at a sync
//   point (a __syncthreads, a warp operation, its return), then the next ready thread goes —
//   the lowest thread index, the highest, or a seeded random one (the same sequence on every
//   run). ROTATE gives launch 0, 1, 2, 3... of the process forward, reverse, random, forward...
//   Warps are no lockstep either (as on Volta and later, with independent thread scheduling). A
//   missing __syncthreads or __syncwarp then always shows the same way: a thread reads shared
//   memory before its writers wrote it, or after the next round overwrote it.
// - Barrier rules are strict on purpose: all threads of a block must reach the same __syncthreads
//   (same source line) and no thread may return while others wait at one; warp operations need all
//   lanes of their mask (lanes a partial last warp lacks are ignored). Breaking a rule, a deadlock
//   between block and warp barriers, an exception thrown by a kernel or an invalid launch
//   configuration throws ddp_emu::KernelFault naming the block, the thread and the cause. A kernel
//   that loops forever without reaching a barrier still hangs.
// - Reading a shuffle source lane that does not take part (outside the mask, or missing from a
//   partial warp) yields all-ones bits (NaN for floats, -1 for signed integers), like undefined.
#pragma once

#if defined(__CUDACC__)
#error "cuda_emu.h is for host compilers; nvcc must use <cuda_runtime.h>"
#endif

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "launch_limits.h"

// ---------------------------------------------------------------------------------------------
// Device-side language
// ---------------------------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __constant__
#define __shared__ static
#define __launch_bounds__(...)

namespace ddp_emu {
namespace detail {
/// Registers one shared array: it is filled with all-ones bytes now and before every block of
/// every launch, so a read of a location the block has not written yet is NaN (floats) or -1
/// (integers), never a plausible value left by the block before.
struct SharedArray {
  SharedArray(void* address, size_t bytes);
};
}  // namespace detail
}  // namespace ddp_emu

/// DDP_EMU_SHARED(name); after a `__shared__` array's declaration: the emulation poisons it
/// between blocks (nothing on a device, see cuda_api.h).
#define DDP_EMU_SHARED(name)                                                                     \
  static const ::ddp_emu::detail::SharedArray ddp_emu_shared_##name(static_cast<void*>(&(name)), \
                                                                    sizeof(name))

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct float3 {
  float x, y, z;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

// CUDA-only math; the standard single-precision functions come from <math.h>.
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return fminf(fmaxf(x, 0.0f), 1.0f); }
// Correctly rounded operations nvcc never contracts into a fused multiply-add. The host
// compiler may (GCC fuses a * b + c by default): the result passes through an empty asm the
// optimiser cannot see into, so it is rounded on its own here too.
inline float ddp_emu_opaque(float x) {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+x"(x));
#elif defined(__aarch64__)
  asm("" : "+w"(x));
#else
  volatile float v = x;
  x = v;
#endif
  return x;
}
inline float __fmul_rn(float x, float y) { return ddp_emu_opaque(x * y); }
inline float __fadd_rn(float x, float y) { return ddp_emu_opaque(x + y); }
inline float __fdiv_rn(float x, float y) { return ddp_emu_opaque(x / y); }
inline float __fsqrt_rn(float x) { return ddp_emu_opaque(sqrtf(x)); }
// The host's conversion rounds to nearest even, as __double2float_rn does.
inline float __double2float_rn(double x) { return ddp_emu_opaque(static_cast<float>(x)); }
inline int __float_as_int(float x) {
  int r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
inline unsigned __float_as_uint(float x) {
  unsigned r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
inline float __int_as_float(int x) {
  float r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
inline float __uint_as_float(unsigned x) {
  float r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }

// Device code calls min/max unqualified on scalars (same-type overloads only).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a < b ? b : a; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a < b ? b : a; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a < b ? b : a; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a < b ? b : a; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a < b ? b : a; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a < b ? b : a; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// Threads of a block really run concurrently, so atomics must be atomic on the host too.
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline float atomicAdd(float* p, float v) {
  float old;
  __atomic_load(p, &old, __ATOMIC_SEQ_CST);
  float desired;
  do {
    desired = old + v;
  } while (
      !__atomic_compare_exchange(p, &old, &desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  return old;
}
inline int atomicMax(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old < v &&
         !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
inline int atomicMin(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old > v &&
         !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline int atomicCAS(int* p, int expected, int desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

namespace ddp_emu {

/// What a launch throws when a kernel breaks a rule, throws, or cannot be launched.
class KernelFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

enum class WarpOp {
  kSyncwarp,
  kShfl,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAny,
  kAll,
  kWmmaLoad,
  kWmmaStore,
  kWmmaMma
};

void sync_threads(const char* file, int line);
void sync_warp(unsigned mask, const char* file, int line);
// The source lane's bits (or all ones when it does not take part).
uint64_t shuffle(WarpOp op, unsigned mask, uint64_t bits, int lane_arg, int width, const char* file,
                 int line);
// Ballot bits, or 0/1 for any/all.
unsigned vote(WarpOp op, unsigned mask, bool predicate, const char* file, int line);
// A collective of all 32 lanes of a full warp (the warp matrix functions, cuda_emu_wmma.h):
// every lane gives `bytes` bytes at `mine` and receives all lanes' bytes, in lane order, in
// `all` (32 x bytes). A warp with fewer than 32 lanes faults.
void warp_all_gather(WarpOp op, const void* mine, size_t bytes, void* all, const char* file,
                     int line);

template <class T>
T shuffle_as(WarpOp op, unsigned mask, T var, int lane_arg, int width, const char* file, int line) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                "warp shuffles move trivially copyable values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = shuffle(op, mask, bits, lane_arg, width, file, line);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace detail
}  // namespace ddp_emu

// The source location defaults name the caller, so faults point at the kernel's line.
#define __syncthreads() ::ddp_emu::detail::sync_threads(__FILE__, __LINE__)

inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  ::ddp_emu::detail::sync_warp(mask, file, line);
}
template <class T>
T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize,
              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::ddp_emu::detail::shuffle_as(::ddp_emu::detail::WarpOp::kShfl, mask, var, srcLane, width,
                                       file, line);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::ddp_emu::detail::shuffle_as(::ddp_emu::detail::WarpOp::kShflUp, mask, var,
                                       static_cast<int>(delta), width, file, line);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::ddp_emu::detail::shuffle_as(::ddp_emu::detail::WarpOp::kShflDown, mask, var,
                                       static_cast<int>(delta), width, file, line);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize,
                  const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::ddp_emu::detail::shuffle_as(::ddp_emu::detail::WarpOp::kShflXor, mask, var, laneMask,
                                       width, file, line);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return ::ddp_emu::detail::vote(::ddp_emu::detail::WarpOp::kBallot, mask, predicate != 0, file,
                                 line);
}
inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return static_cast<int>(
      ::ddp_emu::detail::vote(::ddp_emu::detail::WarpOp::kAny, mask, predicate != 0, file, line));
}
inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return static_cast<int>(
      ::ddp_emu::detail::vote(::ddp_emu::detail::WarpOp::kAll, mask, predicate != 0, file, line));
}

// ---------------------------------------------------------------------------------------------
// Host runtime subset (CUDA's names, numeric codes and signatures)
// ---------------------------------------------------------------------------------------------

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrClockRate = 13,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMemoryClockRate = 36,
  cudaDevAttrGlobalMemoryBusWidth = 37,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
};

struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;

enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};

enum cudaGraphInstantiateFlags {
  cudaGraphInstantiateFlagAutoFreeOnLaunch = 1,
  cudaGraphInstantiateFlagUpload = 2,
  cudaGraphInstantiateFlagDeviceLaunch = 4,
  cudaGraphInstantiateFlagUseNodePriority = 8,
};

constexpr unsigned cudaStreamDefault = 0x0;
constexpr unsigned cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaEventDefault = 0x0;
constexpr unsigned cudaEventBlockingSync = 0x1;
constexpr unsigned cudaEventDisableTiming = 0x2;
constexpr unsigned cudaHostAllocDefault = 0x0;
constexpr unsigned cudaHostAllocPortable = 0x1;
constexpr unsigned cudaHostAllocMapped = 0x2;
constexpr unsigned cudaHostAllocWriteCombined = 0x4;
constexpr unsigned cudaHostRegisterDefault = 0x0;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  size_t totalConstMem;
  int major;
  int minor;
  int multiProcessorCount;
  int memoryBusWidth;
  int l2CacheSize;
  int maxThreadsPerMultiProcessor;
  size_t sharedMemPerMultiprocessor;
};

const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
/// Priorities as on a device: least 0, greatest -5 (lower is more urgent); a priority outside
/// that range is clamped to it, and either pointer of the range may be NULL. The emulation
/// records a stream's priority (cudaStreamGetPriority) but schedules every stream alike.
cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority);
cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaMalloc(void** dev_ptr, size_t size);
cudaError_t cudaFree(void* dev_ptr);
cudaError_t cudaMallocHost(void** ptr, size_t size);
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void* ptr);
/// Page-locks existing host memory: the emulation only checks the arguments and pairs.
cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream = 0);
cudaError_t cudaMemset(void* dev_ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream = 0);

// Stream capture and graphs (see the top of this header for what the emulation does).
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* pCaptureStatus);
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

// The typed overloads CUDA's C++ API adds.
template <class T>
cudaError_t cudaMalloc(T** dev_ptr, size_t size) {
  return ::cudaMalloc(reinterpret_cast<void**>(dev_ptr), size);
}
template <class T>
cudaError_t cudaMallocHost(T** ptr, size_t size) {
  return ::cudaMallocHost(reinterpret_cast<void**>(ptr), size);
}
template <class T>
cudaError_t cudaHostAlloc(T** ptr, size_t size, unsigned int flags) {
  return ::cudaHostAlloc(reinterpret_cast<void**>(ptr), size, flags);
}

// ---------------------------------------------------------------------------------------------
// Launching and test controls
// ---------------------------------------------------------------------------------------------

namespace ddp_emu {

/// The multiprocessor count the emulated device reports (default 4, so grids sized by SM count
/// stay small). n must be >= 1.
void set_sm_count(int n);
int sm_count();
/// The compute capability every emulated device reports (default 8.0); tests of what a kernel
/// library refuses on older devices choose another. The emulation runs every kernel alike.
void set_compute_capability(int major, int minor);
/// cudaMalloc + cudaMallocHost/cudaHostAlloc allocations not yet freed.
int64_t live_allocations();
/// Launches that passed validation and ran (faulted ones included; queued ones once they ran).
int64_t launch_count();
/// Worker threads in the pool (the largest block launched so far).
int worker_threads();

/// How stream-ordered operations run (see the top of this header).
enum class StreamMode { kImmediate, kDeferred };

/// The process's stream mode: DDP_EMU_STREAMS read once, at first use (unless set_stream_mode
/// chose one before). A value parse_stream_mode refuses stops the process with a message.
StreamMode stream_mode();
/// Chooses the mode from now on. Leaving deferred mode first runs every queued operation.
void set_stream_mode(StreamMode mode);
/// A DDP_EMU_STREAMS value: unset or "" or "immediate", or "deferred"; anything else throws
/// std::invalid_argument naming it.
StreamMode parse_stream_mode(const char* value);
/// Deferred mode: how long a queued operation waits for the host before the device's own thread
/// runs it (infinity: never). DDP_EMU_DEVICE_LAG_S read once, at first use (unless
/// set_device_lag chose one before); a value parse_device_lag refuses stops the process.
double device_lag();
/// Chooses the lag from now on (>= 0, infinity for never; else std::invalid_argument).
void set_device_lag(double seconds);
/// A DDP_EMU_DEVICE_LAG_S value: unset or "" (2 s), a number of seconds in [0, 1e6], or
/// "never"; anything else throws std::invalid_argument naming it.
double parse_device_lag(const char* value);
/// Every kernel this process runs from now on takes `seconds` longer (>= 0, else
/// std::invalid_argument), as on a slower GPU or one another job shares: for tests of what one
/// slow device does to its peers. 0 (the default): no delay.
void set_kernel_delay(double seconds);
double kernel_delay();
/// How the threads of a block take turns (see the top of this header).
enum class Schedule { kParallel, kForward, kReverse, kRandom, kRotate };

/// The process's schedule: DDP_EMU_SCHEDULE read once, at first use (unless set_schedule chose
/// one before). A value parse_schedule refuses stops the process with a message.
Schedule schedule();
/// The seed of the kRandom schedule.
uint64_t schedule_seed();
/// Chooses the schedule (and, for kRandom, the seed) for the launches from now on. Launch i
/// after the choice draws its random order from (seed, i), so the same launches after the
/// same choice take the same turns.
void set_schedule(Schedule order, uint64_t seed = 1);
/// A DDP_EMU_SCHEDULE value: unset or "" or "parallel", "forward", "reverse", "random",
/// "random:SEED" (seed 1 by default, stored in *seed) or "rotate"; anything else throws
/// std::invalid_argument naming it.
Schedule parse_schedule(const char* value, uint64_t* seed);

/// Operations queued on `stream` that have not finished (always 0 in immediate mode and for the
/// legacy default stream); -1 for a stream that does not exist.
int64_t queued_operations(cudaStream_t stream);
/// The fault message of the last queued operation that failed in deferred mode ("" if none);
/// it stays after the error was returned.
std::string last_deferred_fault();

/// The runtime calls the emulation served, counted since the start or the last reset: how
/// many host calls a piece of code makes (a training step eager, or replayed as a graph).
struct RuntimeCalls {
  /// Every call of a runtime function (cudaMemcpyAsync, cudaGraphLaunch...) and of the emulated
  /// NCCL (ncclAllReduce...), by name, whatever it returned; a function the emulation
  /// implements through another counts once.
  std::map<std::string, int64_t> api;
  /// Kernel launches (ddp_emu::launch, what <<<...>>> is on a device), refused, queued and
  /// captured ones included; the kernels a graph launch replays are not calls.
  int64_t kernel_launches = 0;
  /// cudaGraphLaunch calls (also in api).
  int64_t graph_launches = 0;
  /// The calls of one function (0 if never called).
  int64_t of(const std::string& name) const {
    const auto it = api.find(name);
    return it == api.end() ? 0 : it->second;
  }
  /// Every host call: the runtime functions and the kernel launches.
  int64_t total() const {
    int64_t n = kernel_launches;
    for (const auto& [name, calls] : api) n += calls;
    return n;
  }
};
/// A snapshot of the counts (every thread's calls).
RuntimeCalls runtime_calls();
/// Starts the counts over from zero.
void reset_runtime_calls();

/// One node of a captured graph, for tests of what a capture recorded.
struct CapturedNode {
  std::string what;          ///< "kernel NAME", "cudaMemcpyAsync", "cudaMemsetAsync", ...
  std::vector<size_t> deps;  ///< indices of the nodes it depends on (all earlier ones)
};
/// The nodes of a graph from cudaStreamEndCapture, in capture order (a topological order:
/// the order a launch runs them in). Throws std::invalid_argument for an unknown graph.
std::vector<CapturedNode> graph_nodes(cudaGraph_t graph);

/// The kernels' compiled resource usage launches are checked against (launch_limits.h): read
/// once, at first use, from the ptxas reports (*.resources) under the directory
/// DDP_EMU_KERNEL_RESOURCES names (the build writes one beside each CUDA object). A launch of a
/// kernel the reports know is refused, as a device of any target architecture would refuse it,
/// with KernelFault (and cudaErrorLaunchOutOfResources or cudaErrorInvalidConfiguration).
/// Without reports only the launch dimensions are checked.
const UsageTable& kernel_usage();
/// Whether kernel_usage() came from reports (DDP_EMU_KERNEL_RESOURCES set and readable).
bool have_kernel_usage();
/// Replaces the table (tests of the check itself); the reports are not read afterwards.
void set_kernel_usage(UsageTable table);

/// One launch seen by an AuditLaunches scope.
struct AuditedLaunch {
  std::string symbol;  ///< the kernel's mangled name ("" when dladdr cannot name it)
  std::string name;    ///< demangled, for messages
  dim3 grid, block;
};

/// While one lives, every launch on this process is checked exactly as a real one (dimensions,
/// and every target architecture's limits for kernels with known usage), recorded, and then
/// neither run nor queued: launch code can be driven with the largest shapes it accepts and
/// null pointers. Not nestable; the launches of other threads are audited too.
class AuditLaunches {
 public:
  AuditLaunches();
  ~AuditLaunches();
  AuditLaunches(const AuditLaunches&) = delete;
  AuditLaunches& operator=(const AuditLaunches&) = delete;
  /// The launches that passed the checks so far, in order.
  std::vector<AuditedLaunch> launches() const;
};

// For the NCCL emulation, which queues its collectives on the caller's stream. None of these
// runs queued work or changes cudaGetLastError().
/// Whether `stream` is the legacy default stream or a live created stream.
bool stream_exists(cudaStream_t stream);
/// Whether the first and the last byte of [p, p + bytes) lie in cudaMalloc memory.
bool is_device_memory(const void* p, size_t bytes);
/// Whether host work enqueued on `stream` now would be captured into a graph (*capturing) and
/// may be: cudaSuccess, or the error CUDA work on that stream would get now
/// (cudaErrorStreamCaptureInvalidated; cudaErrorStreamCaptureImplicit on the legacy stream
/// while a blocking stream captures, which invalidates that capture). Records no last error.
cudaError_t host_work_capture(cudaStream_t stream, bool* capturing);
/// Deferred mode on a created stream: queues `work` to run in stream order and returns true
/// (an exception from it becomes an asynchronous error). A capturing stream records `work` as
/// a graph node instead (dropped if the capture was invalidated) and returns true: it then runs
/// once per launch of the graph. Otherwise returns false, after running what a legacy-stream
/// operation waits for in deferred mode; the caller then runs the work itself, at once.
bool enqueue_host_work(cudaStream_t stream, std::function<void()> work);

namespace detail {

// A launch's kernel and arguments, converted to the parameter types once; run() calls the
// kernel with a copy of them, so every thread gets its own.
class LaunchArgs {
 public:
  virtual ~LaunchArgs() = default;
  virtual void run() const = 0;
};

template <class... KArgs>
class BoundLaunch final : public LaunchArgs {
 public:
  template <class... Args>
  explicit BoundLaunch(void (*kernel)(KArgs...), Args&&... args)
      : kernel_(kernel), args_(std::forward<Args>(args)...) {}
  void run() const override { std::apply(kernel_, args_); }

 private:
  void (*kernel_)(KArgs...);
  std::tuple<std::decay_t<KArgs>...> args_;
};

// Checks the launch, then runs args->run() once per thread of every block, or queues that (the
// arguments stay alive on the heap until it ran). Throws KernelFault when the launch is invalid
// and, when it runs at once, when the kernel faults.
void run_launch(void (*kernel_id)(), const char* name, dim3 grid, dim3 block, cudaStream_t stream,
                std::unique_ptr<const LaunchArgs> args);
}  // namespace detail

/// kernel<<<grid, block, 0, stream>>>(args...) with a name for fault messages (nullptr: the
/// symbol name when the dynamic linker knows it, else the address). Arguments are converted
/// to the kernel's parameter types once, by value, as a real launch does; each thread receives
/// its own copy. Returns when every block has run, or in deferred mode on a created stream when
/// the launch is queued.
template <class... KArgs, class... Args>
void launch_named(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                  cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(KArgs) == sizeof...(Args), "wrong number of kernel arguments");
  detail::run_launch(
      reinterpret_cast<void (*)()>(kernel), name, grid, block, stream,
      std::make_unique<const detail::BoundLaunch<KArgs...>>(kernel, std::forward<Args>(args)...));
}

template <class... KArgs, class... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  launch_named(nullptr, kernel, grid, block, stream, std::forward<Args>(args)...);
}

}  // namespace ddp_emu

/// DDP_EMU_LAUNCH(kernel, grid, block, stream, args...): launch with the kernel's spelling as
/// its name in fault messages.
#define DDP_EMU_LAUNCH(kernel, ...) ::ddp_emu::launch_named(#kernel, kernel, __VA_ARGS__)
